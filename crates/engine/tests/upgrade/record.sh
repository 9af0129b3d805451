#!/usr/bin/env bash
# Records what today's release writes into pods, for tests/upgrade.rs: run once with the binary of
# the release being upgraded from (BIN), from the repository's root. The templates under templates/
# are frozen copies; each case's args name one of them, its input.yaml holds the pods as authored and
# injected.yaml what that release made of them. Never regenerate these with a newer engine: they
# are what a cluster upgraded to it already holds.
set -euo pipefail
BIN=${BIN:?the release binary to record with}
U=crates/engine/tests/upgrade
record() { # case, golden input, templates dir (under templates/), extra args...
  local case=$1 input=$2 templates=$3; shift 3
  mkdir -p "$U/cases/$case"
  cp "$input" "$U/cases/$case/input.yaml"
  { echo "--templates=$templates"; printf '%s\n' "$@"; } > "$U/cases/$case/args"
  "$BIN" inject -f "$U/cases/$case/input.yaml" --templates="$U/templates/$templates" "$@" > "$U/cases/$case/injected.yaml"
  "$BIN" check-templates "$U/templates/$templates" | sed -n 's/^ok  \([^ ]*\) .*hash \([0-9a-f]*\))$/\1 \2/p' > "$U/templates/$templates.hashes"
}
G=crates/engine/tests/golden/cases
record shipped-native "$U/shipped-pods.yaml" shipped --namespace=shop --namespace-labels=sidecar-injector.io/inject=enabled
record shipped-classic "$U/shipped-pods.yaml" shipped --namespace=shop --namespace-labels=sidecar-injector.io/inject=enabled --kube-version=1.28
record conflicts $G/conflicts/input.yaml golden-templates
record enforced $G/enforced-cannot-be-skipped/input.yaml golden-enforced-templates
record env-merge $G/env-merge/input.yaml golden-merge-templates
record namespace-defaults $G/namespace-defaults/input.yaml golden-templates --namespace=shop --namespace-annotations=sidecar-injector.io/mesh.concurrency=4,sidecar-injector.io/mesh.tracing=true,sidecar-injector.io/mesh.adminPort=1,sidecar-injector.io/templates=mesh
record overrides $G/overrides/input.yaml golden-templates
record selectors $G/selectors/input.yaml golden-templates --namespace-labels=sidecar-injector.io/inject=enabled,monitoring=enabled --namespace-annotations=sidecar-injector.io/templates=mesh,agent,logs
record defaults-deployment $G/defaults-deployment/input.yaml golden-templates --namespace-labels=sidecar-injector.io/inject=enabled,monitoring=enabled,team=shop
record old-cluster $G/old-cluster/input.yaml golden-templates --kube-version=1.28
record pull-secrets-env-from $G/pull-secrets-env-from-targets/input.yaml golden-feature-templates
record pod-level-resources $G/pod-level-resources/input.yaml shipped --namespace=shop
record pod-level-resources-share $G/pod-level-resources-share/input.yaml golden-share --namespace=shop
record resources-per-pod $G/resources-per-pod/input.yaml shipped --namespace=shop
record skipped-volume $G/skipped-volume-displaces-its-mounts/input.yaml shipped --namespace=shop
