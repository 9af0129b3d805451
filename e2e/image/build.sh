#!/usr/bin/env bash
# Builds the repository's Dockerfile, unchanged, with BuildKit into an OCI image index:
# OUT/sidecar-injector.oci.tar. The build context is the commit (`git archive HEAD`: what a release
# builds, whatever the working tree holds) or, with --worktree, the working tree's files that git
# tracks or would track (the real-node suite tests what is being changed). The base images are the
# ones base-images.sh makes, given to BuildKit as named contexts under the names the Dockerfile uses.
# Every timestamp is the commit's (SOURCE_DATE_EPOCH, with BuildKit clamping the layers' file times
# to it), so two builds of one commit give one digest. Then checks each platform's image: its config
# and its binary's ELF machine name the platform, and the binary runs (under qemu-user on arm64,
# byte-identical to amd64's output). Prints the index digest and each platform's size, and writes
# OUT/build.env (what release.sh signs and describes).
#
# Usage: build.sh [--platforms linux/amd64,linux/arm64] [--out DIR] [--state DIR] [--worktree]
#   --platforms  the index's platforms (default both)
#   --out        where the archive goes (default dist/; emptied first)
#   --state      BuildKit's state and cache (default e2e/bin/image/buildkit; a new directory
#                builds with a cold cache)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
IMAGE_BIN="$root/e2e/bin/image"
source "$here/versions.env"
source "$here/buildkit.sh"
platforms=linux/amd64,linux/arm64 out="$root/dist" state="$IMAGE_BIN/buildkit" worktree=false
while [ $# -gt 0 ]; do
  case "$1" in
    --platforms) platforms=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    --worktree) worktree=true; shift ;;
    *) echo "image: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
arches=()
for platform in ${platforms//,/ }; do
  case "$platform" in
    linux/amd64|linux/arm64) arches+=("${platform#linux/}") ;;
    *) echo "image: unsupported platform $platform (linux/amd64 and linux/arm64 are built)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" != 0 ]; then
  echo "image: BuildKit's runc worker runs as root here: run the image build as root" >&2
  exit 1
fi
bash "$here/build-tools.sh" build
[[ " ${arches[*]} " == *" arm64 "* ]] && bash "$here/build-tools.sh" release
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
work=$(mktemp -d)
cleanup() {
  buildkit_stop
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$out"
mkdir -p "$work/context" "$out"
if $worktree; then
  source="the working tree at $commit"
  (cd "$root" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
    [ -e "$file" ] && printf '%s\0' "$file"
  done | tar --null -T - -cf -) | tar -x -C "$work/context"
else
  source=$commit
  if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
    echo "image: the working tree has uncommitted changes; the image is built from the commit $commit without them" >&2
  fi
  git -C "$root" archive --format=tar HEAD | tar -x -C "$work/context"
fi
# BuildKit's cache keys a COPY by its files' times too: one fixed time lets a build whose copied
# files did not change reuse their layers.
find "$work/context" -exec touch -h -d @0 {} +

buildkit_start "$state"
# The clamp to SOURCE_DATE_EPOCH only lowers later times. A cache record made before this commit (a
# final-stage COPY of a binary an older commit built byte for byte the same) would be reused with
# its older times, and the image would depend on what the cache held (moby/buildkit#4748): such
# records are removed first. The commit's own records stay, so rebuilding it is cached.
stale=$("$IMAGE_BIN/buildctl" --addr "$BUILDKIT_ADDR" du --format '{{range .}}{{.ID}} {{.CreatedAt.Unix}}{{"\n"}}{{end}}' \
  | awk -v epoch="$epoch" 'NF == 2 && $2 < epoch { printf " --filter id==%s", $1 }')
if [ -n "$stale" ]; then
  # shellcheck disable=SC2086 # one --filter per record
  "$IMAGE_BIN/buildctl" --addr "$BUILDKIT_ADDR" prune $stale > "$work/prune.log"
  echo "image: removed the $(($(wc -w <<< "$stale") / 2)) cache records made before the commit ($(tail -1 "$work/prune.log" | tr -s '\t ' ' '))"
fi
echo "image: building $source for $platforms (BuildKit $BUILDKIT_VERSION, state $state) ..."
start=$SECONDS
build_started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
"$IMAGE_BIN/buildctl" --addr "$BUILDKIT_ADDR" build --progress=plain \
  --frontend dockerfile.v0 --opt cmdline=dockerfile.v0 \
  --local context="$work/context" --local dockerfile="$work/context" \
  --opt platform="$platforms" \
  --opt "context:rust:1.95-bookworm=oci-layout://rust@$rust_base" --oci-layout "rust=$IMAGE_BIN/bases/rust" \
  --opt "context:gcr.io/distroless/cc-debian12:nonroot=oci-layout://distroless@$distroless_base" \
  --oci-layout "distroless=$IMAGE_BIN/bases/distroless" \
  --opt "build-arg:SOURCE_DATE_EPOCH=$epoch" \
  --output "type=oci,dest=$out/sidecar-injector.oci.tar,name=sidecar-injector:$version,rewrite-timestamp=true" \
  > "$work/build.log" 2>&1 || { tail -60 "$work/build.log" >&2; cp "$work/build.log" "$out/build.log"; exit 1; }
cp "$work/build.log" "$out/build.log"
build_finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)
buildkit_stop
echo "image: built in $((SECONDS - start)) s"

index_digest=$(tar -xOf "$out/sidecar-injector.oci.tar" index.json | json - 'd["manifests"][0]["digest"]')
echo "image: $out/sidecar-injector.oci.tar, index $index_digest"

# Each platform's image: its config names the platform, its binary is an ELF for that machine (an
# "arm64" image holding an x86-64 binary has shipped elsewhere), and the binary answers the same on
# both: natively on amd64, under qemu-user on arm64 (in each image's own file system, so the arm64
# binary runs against the arm64 C runtime the image carries).
platform_digests=()
for arch in "${arches[@]}"; do
  skopeo copy --quiet --override-os linux --override-arch "$arch" "oci-archive:$out/sidecar-injector.oci.tar" "dir:$work/$arch"
  platform_digests+=("$arch=sha256:$(sha256sum "$work/$arch/manifest.json" | cut -d' ' -f1)")
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
  mkdir -p "$out/binaries"
  cp "$binary" "$out/binaries/sidecar-injector-$arch"
done
if [ ${#arches[@]} = 2 ]; then
  cmp "$work/amd64.version" "$work/arm64.version" && cmp "$work/amd64.inject" "$work/arm64.inject" \
    || { echo "image: the arm64 binary's output differs from amd64's" >&2; exit 1; }
  echo "image: the arm64 binary under qemu-user: --version and inject -f examples/shop.yaml byte-identical to amd64's ($(wc -c < "$work/amd64.inject") bytes)"
fi

cat > "$out/build.env" <<ENV
# What build.sh built (sourced by release.sh).
commit=$commit
epoch=$epoch
version=$version
worktree=$worktree
platforms=$platforms
index_digest=$index_digest
platform_digests="${platform_digests[*]}"
rust_base=$rust_base
distroless_base=$distroless_base
build_started=$build_started
build_finished=$build_finished
ENV
