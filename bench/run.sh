#!/usr/bin/env bash
# Runs the load benchmark: builds the release binary (the Dockerfile's command), then
# `cargo bench --bench server`, which writes bench/results/results.md and latency.svg.
#   bench/run.sh              full run (about 6.5 minutes on 2 cores, plus the release and bench builds)
#   bench/run.sh --quick      shorter runs, 100 pods
#   bench/run.sh --no-cluster only the server-alone part (no Go needed)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v oha >/dev/null 2>&1 || { echo "bench: oha is not installed: cargo install oha --locked" >&2; exit 1; }
cargo build --release --locked
SIDECAR_INJECTOR_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/sidecar-injector" cargo bench --locked --bench server -- "$@"
