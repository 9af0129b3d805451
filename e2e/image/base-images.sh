#!/usr/bin/env bash
# Makes the Dockerfile's two base images from Debian's packages and rustup, since neither registry
# (docker.io, gcr.io) can be reached here, as OCI layouts that BuildKit reads as named build
# contexts (so the Dockerfile names its real bases and is built unchanged):
#   OUT/rust        `rust:1.95-bookworm` for the build platform (linux/amd64): Debian 12 with the C
#                   toolchain and apt (the build stage installs the cross compiler with it), the Rust
#                   toolchain installed by rustup under /usr/local/{rustup,cargo}, the official
#                   image's environment, and the certificate authorities this machine trusts
#                   beyond Debian's.
#   OUT/distroless  `gcr.io/distroless/cc-debian12:nonroot` for linux/amd64 and linux/arm64: the
#                   Debian packages distroless' cc image is made of, extracted without their
#                   maintainer scripts and without the packages they pull in (as distroless does),
#                   the CA bundle, passwd/group with the nonroot user 65532, /home/nonroot, /tmp, and
#                   each package's control data in /var/lib/dpkg/status.d (what scanners read).
# Prints each image's index digest (index.json names it). Does nothing when OUT/.stamp says they were made from the same
# versions and this script.
#
# Usage: base-images.sh OUT
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.env"
source "$here/../node/oci.sh"
out=$1
mirror="deb http://deb.debian.org/debian $DEBIAN_SUITE main"
security="deb http://deb.debian.org/debian-security $DEBIAN_SUITE-security main"
# distroless cc-debian12: static (base-files, netbase, tzdata, CA certificates), base (libc6,
# libssl3) and cc (libgcc-s1, libgomp1, libstdc++6).
distroless_packages=(base-files netbase tzdata ca-certificates libc6 libssl3 libgcc-s1 libgomp1 libstdc++6)

stamp="debian=$DEBIAN_SUITE rust=$RUST_VERSION $(sha256sum "$0" "$here/../node/oci.sh" | sha256sum | cut -c1-16)"
if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
  echo "image: base images are current ($stamp)"
  exit 0
fi
rm -rf "$out" && mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS

# oci_index LAYOUT NAME "DIGEST SIZE ARCH"...: adds to LAYOUT an index blob of the images given and
# names it NAME in index.json (BuildKit's oci-layout contexts resolve a digest among the blobs, so the
# index must be one, not only index.json); prints its digest.
oci_index() {
  local layout=$1 name=$2 entries="" entry digest size arch index
  shift 2
  for entry in "$@"; do
    read -r digest size arch <<< "$entry"
    entries+="${entries:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$digest\",\"size\":$size,\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"}}"
  done
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "$entries" > "$layout/index-blob.json"
  read -r -a index <<< "$(oci_blob "$layout" "$layout/index-blob.json")"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
    "${index[0]}" "${index[1]}" "$name" > "$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
  echo "image: $name sha256:${index[0]}"
}

# The distroless image for one architecture: the packages' files only.
distroless_rootfs() {
  local arch=$1 rootfs=$2 debs="$work/debs-$1" package deb
  echo "image: distroless cc-debian12 for $arch ..."
  mmdebstrap --quiet --variant=extract --skip=cleanup/apt/cache --architectures="$arch" \
    --include="$(IFS=,; echo "${distroless_packages[*]}")" "$DEBIAN_SUITE" "$debs" "$mirror" "$security"
  mkdir -p "$rootfs/var/lib/dpkg/status.d"
  for package in "${distroless_packages[@]}"; do
    deb=$(ls "$debs/var/cache/apt/archives/${package}_"*.deb)
    dpkg-deb -x "$deb" "$rootfs"
    dpkg-deb -f "$deb" > "$rootfs/var/lib/dpkg/status.d/$package"
  done
  rm -rf "$debs"
  # What ca-certificates' maintainer script would make: the bundle of every certificate it ships.
  mkdir -p "$rootfs/etc/ssl/certs"
  find "$rootfs/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat > "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$rootfs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
  mkdir -p "$rootfs/home/nonroot" "$rootfs/tmp" "$rootfs/root"
  chmod 1777 "$rootfs/tmp"
  chown 65532:65532 "$rootfs/home/nonroot"
  chmod 700 "$rootfs/home/nonroot" "$rootfs/root"
  # No documentation, as distroless.
  rm -rf "$rootfs/usr/share/doc" "$rootfs/usr/share/man" "$rootfs/usr/share/lintian"
}

distroless_config='{"User":"65532","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"WorkingDir":"/home/nonroot"}'
entries=()
for arch in amd64 arm64; do
  distroless_rootfs "$arch" "$work/distroless-$arch"
  entries+=("$(oci_manifest "$out/distroless" "$arch" "$work/distroless-$arch" "$distroless_config") $arch")
  rm -rf "$work/distroless-$arch"
done
oci_index "$out/distroless" gcr.io/distroless/cc-debian12:nonroot "${entries[@]}"

echo "image: rust:$RUST_VERSION-$DEBIAN_SUITE for amd64 ..."
# The official image is buildpack-deps (a C toolchain, curl, git, ...) with rustup's toolchain;
# the build needs the C toolchain (the linker, ring's C code), CA certificates (cargo's downloads)
# and apt (the cross compiler for arm64).
mmdebstrap --quiet --variant=apt --include=ca-certificates,curl,gcc,libc6-dev,make,pkg-config,git \
  "$DEBIAN_SUITE" "$work/rust" "$mirror" "$security"
rustup_init="$work/rustup-init"
curl -sSfL -o "$rustup_init" https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init
chmod +x "$rustup_init"
RUSTUP_HOME="$work/rust/usr/local/rustup" CARGO_HOME="$work/rust/usr/local/cargo" \
  "$rustup_init" -y -q --no-modify-path --profile minimal --default-toolchain "$RUST_VERSION" --default-host x86_64-unknown-linux-gnu \
  > /dev/null
chmod -R a+w "$work/rust/usr/local/rustup" "$work/rust/usr/local/cargo"
# The certificate authorities this machine adds to Debian's (here: the egress proxy's, which
# re-signs the TLS of crates.io and rustup) are added to the build image's too, as
# a site's own build images do; the runtime image keeps Debian's set only.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$work/rust/usr/local/share/ca-certificates/"
  chroot "$work/rust" update-ca-certificates >/dev/null 2>&1
fi
rm -rf "$work/rust/usr/local/rustup/downloads" "$work/rust/usr/local/rustup/tmp" "$work/rust/var/cache/apt/archives/"*.deb "$work/rust/var/lib/apt/lists/"*_Packages
rust_config="{\"Env\":[\"RUSTUP_HOME=/usr/local/rustup\",\"CARGO_HOME=/usr/local/cargo\",\"PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\",\"RUST_VERSION=$RUST_VERSION\"],\"Cmd\":[\"bash\"]}"
oci_index "$out/rust" "rust:1.95-bookworm" "$(oci_manifest "$out/rust" amd64 "$work/rust" "$rust_config") amd64"
echo "$stamp" > "$out/.stamp"
echo "image: base images made in $((SECONDS - start)) s"
