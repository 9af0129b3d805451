#!/usr/bin/env bash
# What make image adds to build.sh's index in DIST (default dist/): the SBOM of each platform's
# binary (the crates it links, as cargo-auditable embedded them, in CycloneDX), the SLSA v1
# provenance of the index (what was built from what, by which builder), and a signature made with a
# key made for this build, over the index, every platform's image, the SBOMs (attestations of their
# platform's image) and the provenance (of the index); then verified as a user would, and the
# signatures and attestations saved beside the archive.
#
# Usage: release.sh [DIST]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
IMAGE_BIN="$root/e2e/bin/image"
source "$here/versions.env"
dist=${1:-$root/dist}
[ -f "$dist/build.env" ] || { echo "image: no $dist/build.env: run build.sh first" >&2; exit 1; }
source "$dist/build.env"
if $worktree; then
  echo "image: $dist holds a build of the working tree, not of a commit: a release signs commits" >&2
  exit 1
fi
bash "$here/build-tools.sh" release
work=$(mktemp -d)
registry_pid=
cleanup() {
  [ -z "$registry_pid" ] || { kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT

for entry in $platform_digests; do
  arch=${entry%%=*}
  "$IMAGE_BIN/bin/auditable2cdx" "$dist/binaries/sidecar-injector-$arch" > "$dist/sbom-$arch.cdx.json"
  echo "image: $dist/sbom-$arch.cdx.json: $(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["components"]))' "$dist/sbom-$arch.cdx.json") crates linked"
done
python3 "$here/provenance.py" --commit "$commit" --epoch "$epoch" \
  --repository "$(git -C "$root" remote get-url origin 2>/dev/null || echo "file://$root")" \
  --dockerfile "$root/Dockerfile" --cargo-lock "$root/Cargo.lock" --platforms "$platforms" \
  --base "rust:1.95-bookworm=$rust_base" --base "gcr.io/distroless/cc-debian12:nonroot=$distroless_base" \
  --buildkit "$BUILDKIT_VERSION" --rust "$RUST_VERSION" --started "$build_started" --finished "$build_finished" \
  > "$dist/provenance.json"

# cosign signs what a registry holds: a registry on loopback. No transparency log is reachable here:
# signing skips it and verifying says so (a release signs keyless, with the log: docs/install.md).
"$IMAGE_BIN/crane" registry serve --address 127.0.0.1:0 > "$work/registry.log" 2>&1 &
registry_pid=$!
port=
for tries in $(seq 1 50); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "image: the loopback registry did not start:" >&2; cat "$work/registry.log" >&2; exit 1; }
repository="127.0.0.1:$port/sidecar-injector"
skopeo copy --quiet --all --preserve-digests --dest-tls-verify=false \
  "oci-archive:$dist/sidecar-injector.oci.tar" "docker://$repository:$version"
pushed=$(skopeo inspect --raw --tls-verify=false "docker://$repository:$version" | sha256sum | cut -d' ' -f1)
[ "sha256:$pushed" = "$index_digest" ] || { echo "image: the registry holds sha256:$pushed, not $index_digest" >&2; exit 1; }
export COSIGN_PASSWORD=""
(cd "$work" && "$IMAGE_BIN/cosign" generate-key-pair --output-key-prefix cosign >/dev/null 2>&1)
cp "$work/cosign.pub" "$dist/cosign.pub"
cosign() {
  "$IMAGE_BIN/cosign" "$@" --allow-http-registry --allow-insecure-registry >> "$work/cosign.log" 2>&1 \
    || { cat "$work/cosign.log" >&2; echo "image: cosign $1 failed" >&2; exit 1; }
}
signing=(--yes --key "$work/cosign.key" --tlog-upload=false)
verifying=(--key "$dist/cosign.pub" --insecure-ignore-tlog=true)
cosign sign "${signing[@]}" --recursive "$repository@$index_digest"
cosign attest "${signing[@]}" --type slsaprovenance1 --predicate "$dist/provenance.json" "$repository@$index_digest"
for entry in $platform_digests; do
  cosign attest "${signing[@]}" --type cyclonedx --predicate "$dist/sbom-${entry%%=*}.cdx.json" "$repository@${entry#*=}"
done
cosign verify "${verifying[@]}" "$repository@$index_digest"
cosign verify-attestation "${verifying[@]}" --type slsaprovenance1 "$repository@$index_digest"
for entry in $platform_digests; do
  cosign verify "${verifying[@]}" "$repository@${entry#*=}"
  cosign verify-attestation "${verifying[@]}" --type cyclonedx "$repository@${entry#*=}"
done
echo "image: signed and attested with $dist/cosign.pub; cosign verify and verify-attestation (slsaprovenance1 on the index, cyclonedx on each platform) pass"
cosign save --dir "$work/signed" "$repository@$index_digest"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@"$epoch" -C "$work/signed" -cf "$dist/signed.oci.tar" .
echo "image: $dist/signed.oci.tar: the index with its signatures and attestations (cosign load --dir)"
