#!/usr/bin/env bash
# Builds the whole-cluster control plane from the Go module proxy into e2e/bin/: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl (with its built-in kustomize), etcd, KWOK (simulated
# nodes), yamlread (kubectl's YAML reader, for the manifest differential test) and nullwebhook (the
# benchmark's floor: a webhook that does nothing). Does nothing when
# the binaries there were built from the same pinned versions (the stamp records the Kubernetes and
# KWOK versions, the go.sum hash and the Go version).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin"
source "$here/versions.env"

if ! command -v go >/dev/null 2>&1; then
  echo "e2e: Go is not installed. The end-to-end suite builds kube-apiserver, etcd and kubectl from" >&2
  echo "Go modules: install Go $(sed -n 's/^go //p' "$here/go.mod") or newer (https://go.dev/dl/) and re-run." >&2
  exit 1
fi

mkdir -p "$bin"
# Our own small commands are rebuilt every time (seconds with Go's build cache), so an edit to
# them is never hidden behind the stamp below.
(cd "$here" && for target in ./cmd/yamlread ./cmd/nullwebhook; do
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/$(basename "$target")" "$target"
done)

stamp="k8s=$KUBERNETES_VERSION kwok=$KWOK_VERSION gosum=$(sha256sum "$here/go.sum" | cut -c1-16) $(go env GOVERSION)"
if [ -f "$bin/.stamp" ] && [ "$(cat "$bin/.stamp")" = "$stamp" ] \
   && [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kubectl" ] && [ -x "$bin/etcd" ] && [ -x "$bin/yamlread" ] \
   && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kube-scheduler" ] && [ -x "$bin/kwok" ] \
   && [ -s "$bin/kwok-stages.yaml" ] && [ -x "$bin/nullwebhook" ]; then
  echo "e2e: control plane binaries are current ($stamp)"
  exit 0
fi

minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"

rm -f "$bin/.stamp"
cd "$here"
start=$SECONDS
for target in k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./cmd/etcd \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler; do
  echo "e2e: building $(basename "$target") ..."
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$(basename "$target")" "$target"
done
# KWOK pins its own Kubernetes libraries, so it is built as its own module (outside this one).
echo "e2e: building kwok $KWOK_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
# KWOK simulates nothing without stages: use the release's own "fast" set (nodes Ready with
# heartbeat leases, pods Running and Ready at once, Job pods Succeeded, deleted pods gone).
kwok_dir=$(cd "$bin" && GOFLAGS= GOWORK=off go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
"$bin/kubectl" kustomize "$kwok_dir/kustomize/stage/fast" > "$bin/kwok-stages.yaml"
echo "$stamp" > "$bin/.stamp"
echo "e2e: control plane built in $((SECONDS - start)) s ($stamp)"
