#!/usr/bin/env bash
# The reproducibility check of `make image`: builds the commit twice, first with BuildKit's cache as
# it is, then with a cold cache (a new state directory), and fails unless both builds give the same
# index digest. Prints both digests and both build times. About twice a cold `make image`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cold=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-injector-buildkit-cold.XXXXXX")
trap 'rm -rf "$cold"' EXIT

# build STATE: builds into dist/ with that BuildKit state; sets digest and took.
build() {
  local start=$SECONDS
  bash "$here/build.sh" --state "$1"
  took=$((SECONDS - start))
  digest=$(sed -n 's/^index_digest=//p' "$root/dist/build.env")
  [ -n "$digest" ] || { echo "image: build.sh wrote no index digest" >&2; exit 1; }
}
build "$root/e2e/bin/image/buildkit"
first=$digest first_took=$took
build "$cold/state"
second=$digest second_took=$took
echo "image: reproducibility: $first (cache as it was, $first_took s)"
echo "image: reproducibility: $second (cold cache, $second_took s)"
if [ "$first" != "$second" ]; then
  echo "image: NOT reproducible: two builds of one commit gave two index digests" >&2
  exit 1
fi
echo "image: reproducible: both builds gave $first"
