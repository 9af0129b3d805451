#!/usr/bin/env bash
# Builds the real node into e2e/bin/node/: kubelet and kube-proxy (the control plane's Kubernetes
# module and version), containerd 2.x with its runc shim and ctr, the CNI plugins, a static pause
# program, and OCI archives of the images the node scenarios run (pause, busybox stand-ins). runc,
# iptables and busybox come from Debian's packages, installed here when missing. Does nothing when
# the stamp says the binaries were built from the same versions.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/.." && pwd)/bin/node"
source "$here/../controlplane/versions.env"
source "$here/versions.env"
source "$here/oci.sh"

missing=()
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
[ -x /usr/bin/busybox ] && ! ldd /usr/bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
command -v gcc >/dev/null 2>&1 && [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(gcc libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "node-e2e: install ${missing[*]} (Debian packages) and re-run" >&2
    exit 1
  fi
  echo "node-e2e: installing ${missing[*]} ..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
for tool in unshare nsenter ip mount tar sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { echo "node-e2e: $tool is required (util-linux, iproute2, tar, coreutils)" >&2; exit 1; }
done

stamp="k8s=$KUBERNETES_VERSION containerd=$CONTAINERD_VERSION cni=$CNI_PLUGINS_VERSION gosum=$(sha256sum "$here/../controlplane/go.sum" | cut -c1-16) $(go env GOVERSION) $(sha256sum "$here/pause.c" "$here/oci.sh" "$here/build.sh" | sha256sum | cut -c1-16)"
if [ -f "$bin/.stamp" ] && [ "$(cat "$bin/.stamp")" = "$stamp" ]; then
  echo "node-e2e: node binaries are current ($stamp)"
  exit 0
fi
rm -f "$bin/.stamp"
mkdir -p "$bin/cni" "$bin/images"
start=$SECONDS

minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
for target in kubelet kube-proxy; do
  echo "node-e2e: building $target ..."
  (cd "$here/../controlplane" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$target" "k8s.io/kubernetes/cmd/$target")
done
# containerd and the CNI plugins are modules of their own (with their own replaces): go install.
echo "node-e2e: building containerd $CONTAINERD_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  -tags "no_btrfs no_devmapper no_zfs" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION")
echo "node-e2e: building the CNI plugins $CNI_PLUGINS_VERSION ..."
(cd "$bin" && CGO_ENABLED=0 GOBIN="$bin/cni" GOFLAGS= GOWORK=off go install -trimpath -ldflags "-s -w" \
  "github.com/containernetworking/plugins/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_PLUGINS_VERSION")

# The images: the sandbox's pause program, and busybox for test apps and the stand-in sidecars.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pause"
gcc -static -O2 -o "$work/pause/pause" "$here/pause.c"
oci_archive "localhost/sidecar-injector-e2e/pause:1" "$work/pause" '{"Entrypoint":["/pause"],"User":"65535:65535"}' "$bin/images/pause.tar"
busybox_rootfs "$work/busybox"
oci_archive "localhost/sidecar-injector-e2e/busybox:1" "$work/busybox" \
  '{"Entrypoint":["/bin/sh"],"User":"65532:65532","Env":["PATH=/bin"]}' "$bin/images/busybox.tar"
# Stand-in for Fluent Bit: takes the log-shipper template's arguments (--prop=path=GLOB) and prints
# every line of the files that match, as `fluent-bit --input=tail --output=stdout` would.
busybox_rootfs "$work/fluent-bit"
cat > "$work/fluent-bit/bin/fluent-bit" <<'SCRIPT'
#!/bin/sh
path=""
for arg; do case "$arg" in --prop=path=*) path="${arg#--prop=path=}" ;; esac; done
echo "fluent-bit stand-in: tailing $path"
trap 'exit 0' TERM
while ! ls $path >/dev/null 2>&1; do sleep 0.2; done
tail -n +1 -F $path &
wait
SCRIPT
chmod 755 "$work/fluent-bit/bin/fluent-bit"
oci_archive "localhost/sidecar-injector-e2e/fluent-bit:1" "$work/fluent-bit" \
  '{"Entrypoint":["/bin/fluent-bit"],"User":"65532:65532","Env":["PATH=/bin"]}' "$bin/images/fluent-bit.tar"
# Stand-in for the OpenTelemetry Collector (the otel-agent template): takes any arguments and
# listens on the OTLP port, so the app sees its agent's port open.
busybox_rootfs "$work/agent"
cat > "$work/agent/bin/agent" <<'SCRIPT'
#!/bin/sh
echo "agent stand-in: $*"
exec httpd -f -p 4317 -h /tmp
SCRIPT
chmod 755 "$work/agent/bin/agent"
oci_archive "localhost/sidecar-injector-e2e/agent:1" "$work/agent" \
  '{"Entrypoint":["/bin/agent"],"User":"65532:65532","Env":["PATH=/bin"]}' "$bin/images/agent.tar"
# An agent's files, for image volumes (its root mounted as a volume) and their fallback (its busybox
# copies /agent into an emptyDir).
busybox_rootfs "$work/agent-files"
mkdir -p "$work/agent-files/agent/lib"
echo "agent-files 1" > "$work/agent-files/agent/VERSION"
echo "not a real agent library" > "$work/agent-files/agent/lib/agent.so"
oci_archive "localhost/sidecar-injector-e2e/agent-files:1" "$work/agent-files" \
  '{"Entrypoint":["/bin/sh"],"User":"65532:65532","Env":["PATH=/bin"]}' "$bin/images/agent-files.tar"

echo "$stamp" > "$bin/.stamp"
echo "node-e2e: node built in $((SECONDS - start)) s ($stamp)"
