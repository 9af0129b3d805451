#!/usr/bin/env bash
# The reproducibility check of `make image`: builds the commit three times and fails unless all give
# the same index digest: with BuildKit's cache as it is, again with the cache that build left (every
# step cached), and with a cold cache (a new state directory). Prints the digests and build times.
# About twice a cold `make image`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cold=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-injector-buildkit-cold.XXXXXX")
trap 'rm -rf "$cold"' EXIT

digests=()
# build STATE WHAT: builds into dist/ with that BuildKit state and records the digest and the time.
build() {
  local start=$SECONDS digest
  bash "$here/build.sh" --state "$1"
  digest=$(sed -n 's/^index_digest=//p' "$root/dist/build.env")
  [ -n "$digest" ] || { echo "image: build.sh wrote no index digest" >&2; exit 1; }
  digests+=("$digest")
  echo "image: reproducibility: $digest ($2, $((SECONDS - start)) s)" >> "$cold/summary"
}
build "$root/e2e/bin/image/buildkit" "cache as it was"
build "$root/e2e/bin/image/buildkit" "cached"
build "$cold/state" "cold cache"
cat "$cold/summary"
if [ "$(printf '%s\n' "${digests[@]}" | sort -u | wc -l)" != 1 ]; then
  echo "image: NOT reproducible: three builds of one commit gave different index digests" >&2
  exit 1
fi
echo "image: reproducible: every build gave ${digests[0]}"
