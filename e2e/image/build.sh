#!/usr/bin/env bash
# Builds the repository's Dockerfile, unchanged, with BuildKit into an OCI image index for
# linux/amd64 and linux/arm64: dist/sidecar-injector.oci.tar. The build context is the commit
# (`git archive HEAD`: what a release builds, whatever the working tree holds), the base images are
# the ones base-images.sh makes, given to BuildKit as named contexts under the names the Dockerfile
# uses, and every timestamp is the commit's (SOURCE_DATE_EPOCH, with BuildKit rewriting the layers'
# file times to it), so two builds of one commit give one digest. Prints the index digest and each
# platform's image size.
#
# Usage: build.sh [STATE]   STATE: BuildKit's state and cache (default e2e/bin/image/buildkit; a
#                           new directory builds with a cold cache).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
IMAGE_BIN="$root/e2e/bin/image"
source "$here/versions.env"
source "$here/buildkit.sh"
state=${1:-$IMAGE_BIN/buildkit}
dist="$root/dist"

if [ "$(id -u)" != 0 ]; then
  echo "image: BuildKit's runc worker runs as root here: run make image as root" >&2
  exit 1
fi
bash "$here/build-tools.sh"
bash "$here/base-images.sh" "$IMAGE_BIN/bases"
# json FILE EXPRESSION: the value of a Python expression over the JSON document `d` in FILE (- for
# standard input); a list prints one item a line.
json() {
  python3 -c 'import json, sys
d = json.load(sys.stdin if sys.argv[1] == "-" else open(sys.argv[1]))
value = eval(sys.argv[2])
print("\n".join(map(str, value)) if isinstance(value, list) else value)' "$1" "$2"
}
# An OCI layout's index.json names its image index: that blob's digest is the image's.
rust_base=$(json "$IMAGE_BIN/bases/rust/index.json" 'd["manifests"][0]["digest"]')
distroless_base=$(json "$IMAGE_BIN/bases/distroless/index.json" 'd["manifests"][0]["digest"]')

commit=$(git -C "$root" rev-parse HEAD)
epoch=$(git -C "$root" log -1 --format=%ct HEAD)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  echo "image: the working tree has uncommitted changes; the image is built from the commit $commit without them" >&2
fi
work=$(mktemp -d)
cleanup() {
  buildkit_stop
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$dist"
mkdir -p "$work/context" "$dist"
git -C "$root" archive --format=tar HEAD | tar -x -C "$work/context"
# git archive stamps every file with the commit's time, and BuildKit's cache keys a COPY by its
# files' times too: one fixed time lets a commit that changes no copied file reuse every layer.
find "$work/context" -exec touch -h -d @0 {} +

buildkit_start "$state"
echo "image: building $commit for linux/amd64 and linux/arm64 (BuildKit $BUILDKIT_VERSION, state $state) ..."
start=$SECONDS
build_started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
"$IMAGE_BIN/buildctl" --addr "$BUILDKIT_ADDR" build --progress=plain \
  --frontend dockerfile.v0 --opt cmdline=dockerfile.v0 \
  --local context="$work/context" --local dockerfile="$work/context" \
  --opt platform=linux/amd64,linux/arm64 \
  --opt "context:rust:1.95-bookworm=oci-layout://rust@$rust_base" --oci-layout "rust=$IMAGE_BIN/bases/rust" \
  --opt "context:gcr.io/distroless/cc-debian12:nonroot=oci-layout://distroless@$distroless_base" \
  --oci-layout "distroless=$IMAGE_BIN/bases/distroless" \
  --opt "build-arg:SOURCE_DATE_EPOCH=$epoch" \
  --output "type=oci,dest=$dist/sidecar-injector.oci.tar,name=sidecar-injector:$version,rewrite-timestamp=true" \
  > "$work/build.log" 2>&1 || { tail -60 "$work/build.log" >&2; cp "$work/build.log" "$dist/build.log"; exit 1; }
cp "$work/build.log" "$dist/build.log"
build_finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo "image: built in $((SECONDS - start)) s"

index_digest=$(tar -xOf "$dist/sidecar-injector.oci.tar" index.json | json - 'd["manifests"][0]["digest"]')
echo "image: dist/sidecar-injector.oci.tar, index $index_digest"

# Each platform's image: its config names the platform, its binary is an ELF for that machine (an
# "arm64" image holding an x86-64 binary has shipped elsewhere), and the binary answers the same on
# both: natively on amd64, under qemu-user on arm64 (in each image's own file system, so the arm64
# binary runs against the arm64 C runtime the image carries).
for arch in amd64 arm64; do
  skopeo copy --quiet --override-os linux --override-arch "$arch" "oci-archive:$dist/sidecar-injector.oci.tar" "dir:$work/$arch"
  config=$(json "$work/$arch/manifest.json" 'd["config"]["digest"].split(":")[1]')
  image_arch=$(json "$work/$arch/$config" 'd["architecture"]')
  [ "$image_arch" = "$arch" ] || { echo "image: the $arch entry's config says $image_arch" >&2; exit 1; }
  mkdir -p "$work/$arch-rootfs"
  size=0
  for layer in $(json "$work/$arch/manifest.json" '[layer["digest"].split(":")[1] for layer in d["layers"]]'); do
    tar -xf "$work/$arch/$layer" -C "$work/$arch-rootfs"
    size=$((size + $(stat -c %s "$work/$arch/$layer")))
  done
  binary="$work/$arch-rootfs/usr/local/bin/sidecar-injector"
  # ELF e_machine, little-endian 16 bits at offset 18: 0x3e x86-64, 0xb7 AArch64.
  machine=$(od -An -tx1 -j18 -N2 "$binary" | tr -d ' \n')
  expected=$([ "$arch" = amd64 ] && echo 3e00 || echo b700)
  [ "$machine" = "$expected" ] || { echo "image: the $arch binary's ELF machine is 0x$machine, not 0x$expected" >&2; exit 1; }
  run=()
  [ "$arch" = arm64 ] && run=(qemu-aarch64-static -L "$work/$arch-rootfs")
  "${run[@]}" "$binary" --version > "$work/$arch.version"
  (cd "$root" && "${run[@]}" "$binary" inject -f examples/shop.yaml) > "$work/$arch.inject"
  echo "image: linux/$arch: $(cat "$work/$arch.version"), compressed layers $((size / 1024 / 1024)) MiB, ELF machine 0x${machine:0:2}"
done
cmp "$work/amd64.version" "$work/arm64.version" && cmp "$work/amd64.inject" "$work/arm64.inject" \
  || { echo "image: the arm64 binary's output differs from amd64's" >&2; exit 1; }
echo "image: the arm64 binary under qemu-user: --version and inject -f examples/shop.yaml byte-identical to amd64's ($(wc -c < "$work/amd64.inject") bytes)"

# The SBOM of each platform's binary: the crates it links, as cargo-auditable embedded them, in
# CycloneDX. The provenance: SLSA v1, what was built from what (the commit, the Dockerfile, the base
# images' digests, the toolchain) by which builder.
for arch in amd64 arm64; do
  "$IMAGE_BIN/bin/auditable2cdx" "$work/$arch-rootfs/usr/local/bin/sidecar-injector" > "$dist/sbom-$arch.cdx.json"
  echo "image: dist/sbom-$arch.cdx.json: $(json "$dist/sbom-$arch.cdx.json" 'len(d["components"])') crates linked"
done
python3 "$here/provenance.py" --commit "$commit" --epoch "$epoch" \
  --repository "$(git -C "$root" remote get-url origin 2>/dev/null || echo "file://$root")" \
  --dockerfile "$root/Dockerfile" --cargo-lock "$root/Cargo.lock" \
  --base "rust:1.95-bookworm=$rust_base" --base "gcr.io/distroless/cc-debian12:nonroot=$distroless_base" \
  --buildkit "$BUILDKIT_VERSION" --rust "$RUST_VERSION" --started "$build_started" --finished "$build_finished" \
  > "$dist/provenance.json"

# Signed with a key made for this build, through a registry on loopback (cosign signs what a
# registry holds): the index and every platform's image, the SBOMs as attestations of their
# platform's image, the provenance of the index; then verified as a user would, and the signatures
# and attestations saved beside the archive. No transparency log is reachable here: signing skips
# it and verifying says so (a release signs keyless, with the log: docs/install.md).
"$IMAGE_BIN/crane" registry serve --address 127.0.0.1:0 > "$work/registry.log" 2>&1 &
registry_pid=$!
for tries in $(seq 1 50); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "image: the loopback registry did not start:" >&2; cat "$work/registry.log" >&2; exit 1; }
stop_registry() { kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; }
cleanup() {
  stop_registry
  buildkit_stop
  rm -rf "$work"
}
repository="127.0.0.1:$port/sidecar-injector"
skopeo copy --quiet --all --preserve-digests --dest-tls-verify=false \
  "oci-archive:$dist/sidecar-injector.oci.tar" "docker://$repository:$version"
pushed=$(skopeo inspect --raw --tls-verify=false "docker://$repository:$version" | sha256sum | cut -d' ' -f1)
[ "sha256:$pushed" = "$index_digest" ] || { echo "image: the registry holds sha256:$pushed, not $index_digest" >&2; exit 1; }
export COSIGN_PASSWORD=""
(cd "$work" && "$IMAGE_BIN/cosign" generate-key-pair --output-key-prefix cosign >/dev/null 2>&1)
cp "$work/cosign.pub" "$dist/cosign.pub"
cosign=("$IMAGE_BIN/cosign")
registry_flags=(--allow-http-registry --allow-insecure-registry)
"${cosign[@]}" sign --yes --key "$work/cosign.key" --tlog-upload=false --recursive "${registry_flags[@]}" \
  "$repository@$index_digest" > "$work/sign.log" 2>&1 || { cat "$work/sign.log" >&2; exit 1; }
for arch in amd64 arm64; do
  platform_digest="sha256:$(sha256sum "$work/$arch/manifest.json" | cut -d' ' -f1)"
  "${cosign[@]}" attest --yes --key "$work/cosign.key" --tlog-upload=false "${registry_flags[@]}" \
    --type cyclonedx --predicate "$dist/sbom-$arch.cdx.json" "$repository@$platform_digest" >> "$work/sign.log" 2>&1 \
    || { cat "$work/sign.log" >&2; exit 1; }
done
"${cosign[@]}" attest --yes --key "$work/cosign.key" --tlog-upload=false "${registry_flags[@]}" \
  --type slsaprovenance1 --predicate "$dist/provenance.json" "$repository@$index_digest" >> "$work/sign.log" 2>&1 \
  || { cat "$work/sign.log" >&2; exit 1; }
verify=(--key "$dist/cosign.pub" --insecure-ignore-tlog=true "${registry_flags[@]}")
"${cosign[@]}" verify "${verify[@]}" "$repository@$index_digest" > "$work/verify.json" 2>"$work/verify.log" \
  || { cat "$work/verify.log" >&2; exit 1; }
"${cosign[@]}" verify-attestation "${verify[@]}" --type slsaprovenance1 "$repository@$index_digest" \
  > /dev/null 2>>"$work/verify.log" || { cat "$work/verify.log" >&2; exit 1; }
for arch in amd64 arm64; do
  platform_digest="sha256:$(sha256sum "$work/$arch/manifest.json" | cut -d' ' -f1)"
  "${cosign[@]}" verify "${verify[@]}" "$repository@$platform_digest" > /dev/null 2>>"$work/verify.log" \
    || { cat "$work/verify.log" >&2; exit 1; }
  "${cosign[@]}" verify-attestation "${verify[@]}" --type cyclonedx "$repository@$platform_digest" \
    > /dev/null 2>>"$work/verify.log" || { cat "$work/verify.log" >&2; exit 1; }
done
echo "image: signed and attested with dist/cosign.pub; cosign verify and verify-attestation (slsaprovenance1 on the index, cyclonedx on each platform) pass"
"${cosign[@]}" save --dir "$work/signed" "${registry_flags[@]}" "$repository@$index_digest" >/dev/null 2>&1
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@"$epoch" -C "$work/signed" -cf "$dist/signed.oci.tar" .
echo "image: dist/signed.oci.tar: the index with its signatures and attestations (cosign load --dir)"
