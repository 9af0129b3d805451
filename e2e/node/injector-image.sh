#!/usr/bin/env bash
# Assembles the injector's image without a registry: the same content as the Dockerfile's final
# stage (gcr.io/distroless/cc-debian12:nonroot + the release binary). distroless cc-debian12 is
# Debian 12's C runtime (glibc, libgcc_s), CA certificates, /etc/passwd and /etc/group with the
# nonroot user 65532, and /tmp; this machine is Debian 12, so those files are taken from the host.
# tests/node_e2e/image.rs reads the Dockerfile and fails when it and this image disagree (binary
# path, user, entrypoint, command, ports).
#
# Usage: injector-image.sh RELEASE_BINARY IMAGE_NAME OUT.tar
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/oci.sh"
binary=$1 name=$2 out=$3

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot"
chmod 1777 "$rootfs/tmp"
cp "$binary" "$rootfs/usr/local/bin/sidecar-injector"
# The shared libraries the binary needs, at the paths the dynamic loader looks them up.
for lib in $(ldd "$binary" | grep -oE '/[^ ]+'); do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n' > "$rootfs/etc/group"

# The Dockerfile's final stage: USER, EXPOSE, ENTRYPOINT, CMD (and distroless' own environment).
config='{"User":"65532:65532","ExposedPorts":{"8443/tcp":{},"8080/tcp":{}},'
config+='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],'
config+='"Entrypoint":["/usr/local/bin/sidecar-injector"],"Cmd":["serve"],"WorkingDir":"/home/nonroot"}'
oci_archive "$name" "$rootfs" "$config" "$out"
