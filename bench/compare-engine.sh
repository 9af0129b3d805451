#!/usr/bin/env bash
# Runs the engine benchmark (crates/engine/benches/engine.rs) of an earlier commit and of the work
# tree one after the other, and prints their re-admission rows side by side: time and allocations
# per decision, old and new, measured on the same machine in the same minutes.
#   bench/compare-engine.sh [BASE]   BASE: a commit (default HEAD); also `make bench-compare BENCH_BASE=...`
# The earlier commit is checked out into a temporary git worktree, removed on exit; both builds share
# the target directory (the earlier engine is another package path there, so neither evicts the other).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-HEAD}"
target="${CARGO_TARGET_DIR:-$PWD/target}"
worktree="$(mktemp -d "${TMPDIR:-/tmp}/engine-bench-base.XXXXXX")"
cleanup() { git worktree remove --force "$worktree" >/dev/null 2>&1 || rm -rf "$worktree"; }
trap cleanup EXIT
git worktree add --detach --quiet "$worktree" "$base"

# The rows between the "re-admission" heading and the next blank line: name, µs, allocations.
rows() { awk '/^re-admission /{on=1; next} on && NF==0 {exit} on {print}'; }
old="$(cd "$worktree" && CARGO_TARGET_DIR="$target" cargo bench --locked -q -p sidecar-injector-engine --bench engine 2>/dev/null | rows)"
new="$(CARGO_TARGET_DIR="$target" cargo bench --locked -q -p sidecar-injector-engine --bench engine 2>/dev/null | rows)"
[ -n "$old" ] && [ -n "$new" ] || { echo "compare-engine: a run printed no re-admission rows" >&2; exit 1; }

printf 'base %s (%s) against the work tree\n' "$(git rev-parse --short "$base")" "$base"
printf '%-56s %10s %10s %7s %10s %10s\n' "re-admission" "µs before" "µs after" "ratio" "allocs bef" "allocs aft"
paste -d '\n' <(printf '%s\n' "$old") <(printf '%s\n' "$new") | awk '
    # Each pair of lines is one case, old then new; the last two fields are µs and allocations.
    NR % 2 == 1 { old_us = $(NF-1); old_n = $NF; next }
    {
        name = $0; sub(/[ ]+[0-9.]+[ ]+[0-9]+$/, "", name)
        printf "%-56s %10.1f %10.1f %7.2f %10d %10d\n", name, old_us, $(NF-1), $(NF-1) / old_us, old_n, $NF
    }'
