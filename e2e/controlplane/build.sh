#!/usr/bin/env bash
# Builds kube-apiserver, kubectl (with its built-in kustomize), etcd and yamlread (kubectl's YAML
# reader, for the manifest differential test) from the Go module proxy into e2e/bin/. Does nothing when the binaries there were built from the same pinned versions (the stamp
# records the Kubernetes version, the go.sum hash and the Go version).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin"
source "$here/versions.env"

if ! command -v go >/dev/null 2>&1; then
  echo "e2e: Go is not installed. The end-to-end suite builds kube-apiserver, etcd and kubectl from" >&2
  echo "Go modules: install Go $(sed -n 's/^go //p' "$here/go.mod") or newer (https://go.dev/dl/) and re-run." >&2
  exit 1
fi

stamp="k8s=$KUBERNETES_VERSION gosum=$(sha256sum "$here/go.sum" | cut -c1-16) $(go env GOVERSION)"
if [ -f "$bin/.stamp" ] && [ "$(cat "$bin/.stamp")" = "$stamp" ] \
   && [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kubectl" ] && [ -x "$bin/etcd" ] && [ -x "$bin/yamlread" ]; then
  echo "e2e: control plane binaries are current ($stamp)"
  exit 0
fi

minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"

mkdir -p "$bin"
rm -f "$bin/.stamp"
cd "$here"
start=$SECONDS
for target in ./cmd/yamlread k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./cmd/etcd; do
  echo "e2e: building $(basename "$target") ..."
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$(basename "$target")" "$target"
done
echo "$stamp" > "$bin/.stamp"
echo "e2e: control plane built in $((SECONDS - start)) s ($stamp)"
