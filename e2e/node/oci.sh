#!/usr/bin/env bash
# oci_archive NAME ROOTFS CONFIG_JSON OUT: writes an OCI image archive (one uncompressed layer made
# from ROOTFS, the runtime config given as JSON) that `ctr images import` reads; NAME becomes the
# image's name in containerd (the index's `io.containerd.image.name` annotation). The layer is made
# reproducibly (sorted names, owner 0, mtime 0), so the same inputs give the same digests.
# Also leaves the unpacked layout in OUT.d/ for tests that read the image back.
oci_archive() {
  local name=$1 rootfs=$2 config=$3 out=$4
  local layout="$out.d"
  rm -rf "$layout" && mkdir -p "$layout/blobs/sha256"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$rootfs" -cf "$layout/layer.tar" .
  local layer_digest layer_size config_digest config_size manifest_digest manifest_size
  layer_digest=$(sha256sum "$layout/layer.tar" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$layout/layer.tar")
  mv "$layout/layer.tar" "$layout/blobs/sha256/$layer_digest"
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$config" "$layer_digest" > "$layout/config.json"
  config_digest=$(sha256sum "$layout/config.json" | cut -d' ' -f1)
  config_size=$(stat -c %s "$layout/config.json")
  mv "$layout/config.json" "$layout/blobs/sha256/$config_digest"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" > "$layout/manifest.json"
  manifest_digest=$(sha256sum "$layout/manifest.json" | cut -d' ' -f1)
  manifest_size=$(stat -c %s "$layout/manifest.json")
  mv "$layout/manifest.json" "$layout/blobs/sha256/$manifest_digest"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$name" "${name##*:}" > "$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$out" oci-layout index.json blobs
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
