#!/usr/bin/env bash
# buildkit_start STATE: starts a root buildkitd with its runc worker (Debian's runc; overlayfs
# snapshots; the host's network, so cargo and apt reach their registries) keeping its state and
# cache in STATE, and waits until it answers. Sets BUILDKIT_PID and BUILDKIT_ADDR.
# buildkit_stop: stops that buildkitd by its PID and unmounts whatever it left mounted under STATE.
# Sourced by build.sh; needs the tools of build-tools.sh in $IMAGE_BIN.
buildkit_start() {
  BUILDKIT_STATE=$1
  mkdir -p "$BUILDKIT_STATE"
  BUILDKIT_ADDR="unix://$BUILDKIT_STATE/buildkitd.sock"
  "$IMAGE_BIN/buildkitd" --root "$BUILDKIT_STATE" --addr "$BUILDKIT_ADDR" \
    --oci-worker=true --oci-worker-binary "$(command -v runc)" --oci-worker-snapshotter=overlayfs \
    --oci-worker-net=host --oci-worker-gc=false --containerd-worker=false \
    > "$BUILDKIT_STATE/buildkitd.log" 2>&1 &
  BUILDKIT_PID=$!
  local tries
  for tries in $(seq 1 100); do
    if "$IMAGE_BIN/buildctl" --addr "$BUILDKIT_ADDR" debug workers >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$BUILDKIT_PID" 2>/dev/null; then
      echo "image: buildkitd exited at start:" >&2
      tail -20 "$BUILDKIT_STATE/buildkitd.log" >&2
      return 1
    fi
    sleep 0.2
  done
  echo "image: buildkitd did not answer within 20 s:" >&2
  tail -20 "$BUILDKIT_STATE/buildkitd.log" >&2
  return 1
}

buildkit_stop() {
  [ -n "${BUILDKIT_PID:-}" ] || return 0
  if kill -0 "$BUILDKIT_PID" 2>/dev/null; then
    kill "$BUILDKIT_PID"
    local tries
    for tries in $(seq 1 100); do
      kill -0 "$BUILDKIT_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$BUILDKIT_PID" 2>/dev/null || true
  fi
  wait "$BUILDKIT_PID" 2>/dev/null || true
  BUILDKIT_PID=
  # Snapshots a killed buildkitd could not unmount, deepest first.
  local mount
  for mount in $(awk -v state="$BUILDKIT_STATE" 'index($2, state) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount -l "$mount" 2>/dev/null || true
  done
}
