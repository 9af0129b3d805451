#!/usr/bin/env bash
# Builds the test suite's tools from the Go module proxy into e2e/bin/: promtool (Prometheus's rule
# checker and unit tester, for deploy/components/monitoring) and helm (for charts/). Each is its own module, installed
# with `go install pkg@version` outside any module. Does nothing when the binaries there were built
# from the same versions with the same Go (the stamp records them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin"
source "$here/versions.env"

if ! command -v go >/dev/null 2>&1; then
  echo "tools: Go is not installed: install Go 1.26 or newer (https://go.dev/dl/) and re-run." >&2
  exit 1
fi
mkdir -p "$bin"
stamp="prometheus=$PROMETHEUS_VERSION helm=$HELM_VERSION $(go env GOVERSION)"
if [ -f "$bin/.tools-stamp" ] && [ "$(cat "$bin/.tools-stamp")" = "$stamp" ] && [ -x "$bin/promtool" ] && [ -x "$bin/helm" ]; then
  echo "tools: current ($stamp)"
  exit 0
fi
rm -f "$bin/.tools-stamp"
start=$SECONDS
echo "tools: building promtool $PROMETHEUS_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION")
echo "tools: building helm $HELM_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION")
echo "$stamp" > "$bin/.tools-stamp"
echo "tools: built in $((SECONDS - start)) s ($stamp)"
