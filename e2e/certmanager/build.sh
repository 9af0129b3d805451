#!/usr/bin/env bash
# Builds a real cert-manager into e2e/bin/node/: main.go runs cert-manager's own certificate, issuer
# (selfSigned, CA), certificate-request and CA-injector controllers from the published packages of
# github.com/cert-manager/cert-manager (its command binaries are separate modules the Go module
# proxy does not serve), and its CRDs are copied from that module's deploy/crds/. A module of its
# own: cert-manager pins other k8s.io versions than the control plane's module. Does nothing when
# the stamp says it was built from the same sources with the same Go.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin/node"
mkdir -p "$bin"
stamp="$(sha256sum "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/build.sh" | sha256sum | cut -c1-16) $(go env GOVERSION)"
if [ -f "$bin/.cert-manager-stamp" ] && [ "$(cat "$bin/.cert-manager-stamp")" = "$stamp" ] && [ -x "$bin/cert-manager" ]; then
  echo "cert-manager: current ($stamp)"
  exit 0
fi
rm -f "$bin/.cert-manager-stamp"
start=$SECONDS
version=$(sed -n 's|^\tgithub.com/cert-manager/cert-manager \(v[^ ]*\)$|\1|p' "$here/go.mod")
echo "cert-manager: building $version's controllers ..."
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off go build -trimpath -ldflags "-s -w" -o "$bin/cert-manager" .)
module_dir=$(cd "$here" && GOFLAGS=-mod=readonly GOWORK=off go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
rm -rf "$bin/cert-manager-crds" && mkdir -p "$bin/cert-manager-crds"
cp "$module_dir"/deploy/crds/cert-manager.io_*.yaml "$bin/cert-manager-crds/"
chmod 644 "$bin"/cert-manager-crds/*.yaml
echo "$stamp" > "$bin/.cert-manager-stamp"
echo "cert-manager: built in $((SECONDS - start)) s ($version)"
