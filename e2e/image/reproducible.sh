#!/usr/bin/env bash
# The reproducibility check of `make image`: builds the commit twice, the second time with a cold
# BuildKit cache (a new state directory), and fails unless both builds give the same index digest.
# Prints both digests and both build times. About twice a cold `make image`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cold=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-injector-buildkit-cold.XXXXXX")
trap 'rm -rf "$cold"' EXIT

index_digest() {
  tar -xOf "$root/dist/sidecar-injector.oci.tar" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])'
}
start=$SECONDS
bash "$here/build.sh"
first=$(index_digest) first_took=$((SECONDS - start))
start=$SECONDS
bash "$here/build.sh" "$cold"
second=$(index_digest) second_took=$((SECONDS - start))
echo "image: reproducibility: $first (cache as it was, $first_took s)"
echo "image: reproducibility: $second (cold cache, $second_took s)"
if [ "$first" != "$second" ]; then
  echo "image: NOT reproducible: two builds of one commit gave two index digests" >&2
  exit 1
fi
echo "image: reproducible: both builds gave $first"
