#!/usr/bin/env bash
# The reproducibility check of `make image`: builds the commit twice, the second time with a cold
# BuildKit cache (a new state directory), and fails unless both builds give the same index digest.
# Prints both digests and both build times. About twice a cold `make image`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cold=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-injector-buildkit-cold.XXXXXX")
trap 'rm -rf "$cold" "$cold.log"' EXIT

# build.sh prints the index digest it built.
build() {
  local start=$SECONDS
  bash "$here/build.sh" "$@" | tee "$cold.log"
  digest=$(sed -n 's/^image: dist\/sidecar-injector.oci.tar, index \(sha256:[0-9a-f]*\)$/\1/p' "$cold.log")
  took=$((SECONDS - start))
  [ -n "$digest" ] || { echo "image: build.sh printed no index digest" >&2; exit 1; }
}
build
first=$digest first_took=$took
build "$cold"
second=$digest second_took=$took
echo "image: reproducibility: $first (cache as it was, $first_took s)"
echo "image: reproducibility: $second (cold cache, $second_took s)"
if [ "$first" != "$second" ]; then
  echo "image: NOT reproducible: two builds of one commit gave two index digests" >&2
  exit 1
fi
echo "image: reproducible: both builds gave $first"
