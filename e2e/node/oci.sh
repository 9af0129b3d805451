#!/usr/bin/env bash
# oci_blob LAYOUT FILE: moves FILE into LAYOUT's blobs under its digest; prints "DIGEST SIZE".
oci_blob() {
  local layout=$1 file=$2 digest size
  digest=$(sha256sum "$file" | cut -d' ' -f1)
  size=$(stat -c %s "$file")
  mkdir -p "$layout/blobs/sha256"
  mv "$file" "$layout/blobs/sha256/$digest"
  echo "$digest $size"
}

# oci_manifest LAYOUT ARCH ROOTFS CONFIG_JSON: adds to LAYOUT's blobs an image for linux/ARCH of one
# uncompressed layer made from ROOTFS, with the runtime config given as JSON; prints its manifest's
# "DIGEST SIZE". The layer is made reproducibly (sorted names, owner 0, mtime 0), so the same inputs
# give the same digests. Its history entry (the calling script, at time 0, as distroless' own images
# say 1970) is what BuildKit keeps for a base image's layers; without one it would describe the base
# layer with a time from its own cache.
oci_manifest() {
  local layout=$1 arch=$2 rootfs=$3 config=$4 layer config_blob
  mkdir -p "$layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$rootfs" -cf "$layout/layer.tar" .
  read -r -a layer <<< "$(oci_blob "$layout" "$layout/layer.tar")"
  printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"%s"}]}' \
    "$arch" "$config" "${layer[0]}" "${0##*/}" > "$layout/config.json"
  read -r -a config_blob <<< "$(oci_blob "$layout" "$layout/config.json")"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "${config_blob[0]}" "${config_blob[1]}" "${layer[0]}" "${layer[1]}" > "$layout/manifest.json"
  oci_blob "$layout" "$layout/manifest.json"
}

# oci_archive NAME ROOTFS CONFIG_JSON OUT: writes an OCI image archive (one linux/amd64 image made by
# oci_manifest) that `ctr images import` reads; NAME becomes the image's name in containerd (the
# index's `io.containerd.image.name` annotation).
oci_archive() {
  local name=$1 rootfs=$2 config=$3 out=$4
  local layout="$out.d" manifest
  rm -rf "$layout"
  read -r -a manifest <<< "$(oci_manifest "$layout" amd64 "$rootfs" "$config")"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "${manifest[0]}" "${manifest[1]}" "$name" "${name##*:}" > "$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$out" oci-layout index.json blobs
  rm -rf "$layout"
}

# busybox_rootfs DIR: a root filesystem with Debian's static busybox and its applets as links.
busybox_rootfs() {
  local dir=$1
  mkdir -p "$dir/bin" "$dir/etc" "$dir/tmp" "$dir/proc" "$dir/sys" "$dir/dev"
  chmod 1777 "$dir/tmp"
  cp /usr/bin/busybox "$dir/bin/busybox"
  local applet
  for applet in $("$dir/bin/busybox" --list); do
    [ -e "$dir/bin/$applet" ] || ln -s busybox "$dir/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n' > "$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$dir/etc/group"
}
