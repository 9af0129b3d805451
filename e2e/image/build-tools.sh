#!/usr/bin/env bash
# Builds the image build's tools into e2e/bin/image/ and installs the Debian packages they run with.
#   build-tools.sh build     what building the image needs (build.sh; the real-node suite builds the
#                            amd64 image with it): buildkitd and buildctl (BuildKit, as tools of this
#                            directory's Go module: see gen-go-mod.sh); runc for BuildKit's worker,
#                            mmdebstrap for the base images, skopeo to read OCI archives, python3 to
#                            read their JSON.
#   build-tools.sh release   that and what make image adds (release.sh): cosign and crane (each
#                            `go install`ed from the Go module proxy), auditable2cdx (crates.io: reads
#                            a binary's cargo-auditable data as CycloneDX), and qemu-user-static for
#                            the arm64 smoke test.
# Does nothing when the stamps say the tools were built from the same versions.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin/image"
source "$here/versions.env"
mode=${1:?usage: build-tools.sh build|release}
case "$mode" in build|release) ;; *) echo "usage: build-tools.sh build|release" >&2; exit 2 ;; esac

if ! command -v go >/dev/null 2>&1; then
  echo "image: Go is not installed: install Go $(sed -n 's/^go //p' "$here/go.mod") or newer (https://go.dev/dl/) and re-run." >&2
  exit 1
fi
commands=(runc mmdebstrap skopeo python3)
[ "$mode" = release ] && commands+=(qemu-aarch64-static)
missing=()
for tool in "${commands[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$([ "$tool" = qemu-aarch64-static ] && echo qemu-user-static || echo "$tool")")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "image: install ${missing[*]} (Debian packages) and re-run" >&2
    exit 1
  fi
  echo "image: installing ${missing[*]} ..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$bin"

# current STAMP_FILE STAMP FILE...: whether STAMP_FILE says STAMP and every FILE is executable.
current() {
  local stamp_file=$1 stamp=$2 file
  shift 2
  [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] || return 1
  for file in "$@"; do [ -x "$file" ] || return 1; done
}

stamp="buildkit=$BUILDKIT_VERSION gosum=$(sha256sum "$here/go.sum" | cut -c1-16) $(go env GOVERSION)"
if current "$bin/.stamp-build" "$stamp" "$bin/buildkitd" "$bin/buildctl"; then
  echo "image: build tools are current ($stamp)"
else
  rm -f "$bin/.stamp-build"
  start=$SECONDS
  for tool in buildkitd buildctl; do
    echo "image: building $tool $BUILDKIT_VERSION ..."
    (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/moby/buildkit/version.Version=$BUILDKIT_VERSION" \
      -o "$bin/$tool" "github.com/moby/buildkit/cmd/$tool")
  done
  echo "$stamp" > "$bin/.stamp-build"
  echo "image: build tools built in $((SECONDS - start)) s ($stamp)"
fi
[ "$mode" = release ] || exit 0

stamp="cosign=$COSIGN_VERSION crane=$CRANE_VERSION auditable2cdx=$AUDITABLE2CDX_VERSION $(go env GOVERSION)"
if current "$bin/.stamp-release" "$stamp" "$bin/cosign" "$bin/crane" "$bin/bin/auditable2cdx"; then
  echo "image: release tools are current ($stamp)"
  exit 0
fi
rm -f "$bin/.stamp-release"
start=$SECONDS
echo "image: building cosign $COSIGN_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION")
echo "image: building crane $CRANE_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION")
echo "image: building auditable2cdx $AUDITABLE2CDX_VERSION ..."
cargo install --quiet --locked --root "$bin" "auditable2cdx@$AUDITABLE2CDX_VERSION"
echo "$stamp" > "$bin/.stamp-release"
echo "image: release tools built in $((SECONDS - start)) s ($stamp)"
