#!/usr/bin/env bash
# Builds the image build's tools into e2e/bin/image/: buildkitd and buildctl (BuildKit, as tools of
# this directory's Go module: see gen-go-mod.sh), cosign and crane (each `go install`ed from the Go
# module proxy), auditable2cdx (crates.io: reads a binary's cargo-auditable data as CycloneDX), and installs the Debian packages it runs with (runc for BuildKit's worker,
# mmdebstrap for the base images, qemu-user-static for the arm64 smoke test, skopeo to read and
# copy OCI archives, python3 to read their JSON). Does nothing when the stamp says the tools were
# built from the same versions.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin/image"
source "$here/versions.env"

if ! command -v go >/dev/null 2>&1; then
  echo "image: Go is not installed: install Go $(sed -n 's/^go //p' "$here/go.mod") or newer (https://go.dev/dl/) and re-run." >&2
  exit 1
fi
missing=()
for tool in runc mmdebstrap qemu-aarch64-static skopeo python3; do
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
stamp="buildkit=$BUILDKIT_VERSION cosign=$COSIGN_VERSION crane=$CRANE_VERSION auditable2cdx=$AUDITABLE2CDX_VERSION gosum=$(sha256sum "$here/go.sum" | cut -c1-16) $(go env GOVERSION)"
if [ -f "$bin/.stamp" ] && [ "$(cat "$bin/.stamp")" = "$stamp" ] \
   && [ -x "$bin/buildkitd" ] && [ -x "$bin/buildctl" ] && [ -x "$bin/cosign" ] && [ -x "$bin/crane" ] && [ -x "$bin/bin/auditable2cdx" ]; then
  echo "image: tools are current ($stamp)"
  exit 0
fi
rm -f "$bin/.stamp"
start=$SECONDS
for tool in buildkitd buildctl; do
  echo "image: building $tool $BUILDKIT_VERSION ..."
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/moby/buildkit/version.Version=$BUILDKIT_VERSION" \
    -o "$bin/$tool" "github.com/moby/buildkit/cmd/$tool")
done
echo "image: building cosign $COSIGN_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION")
echo "image: building crane $CRANE_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION")
echo "image: building auditable2cdx $AUDITABLE2CDX_VERSION ..."
cargo install --quiet --locked --root "$bin" "auditable2cdx@$AUDITABLE2CDX_VERSION"
echo "$stamp" > "$bin/.stamp"
echo "image: tools built in $((SECONDS - start)) s ($stamp)"
