#!/usr/bin/env bash
# Mutation testing with cargo-mutants (crates.io): each mutant is the code with one change
# (a return value, an operator, a deleted match arm); a mutant the tests do not catch is
# "missed". Slow on 2 cores, so not part of .ci/run: run it after changing one of the paths
# below, and record what it missed (and why each is caught since or equivalent) in
# docs/mutants.md.
#
#   scripts/mutants.sh            every path below
#   scripts/mutants.sh chain      only the vhost-user-blk chain parser (about 15 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
out=${MUTANTS_OUT:-target/mutants}
mkdir -p "$out"

run() { # package, then files
    local pkg=$1
    shift
    local args=()
    for f in "$@"; do args+=(-f "$f"); done
    cargo mutants --no-shuffle -p "$pkg" "${args[@]}" -o "$out/$pkg" -- --lib || true
    echo "== $pkg: missed mutants"
    cat "$out/$pkg/mutants.out/missed.txt" 2>/dev/null || true
}

case "${1:-all}" in
chain)
    run aio-vhost-user-blk vhost-user-blk/src/chain.rs
    ;;
all)
    run aio-vhost-user-blk vhost-user-blk/src/chain.rs
    run aio-core aio-core/src/engine/driver.rs aio-core/src/engine/routed.rs \
        aio-core/src/backend/inflight.rs aio-core/src/backend/queue.rs \
        aio-core/src/backend/blocking.rs aio-core/src/context/defer.rs
    ;;
*)
    echo "usage: scripts/mutants.sh [chain|all]" >&2
    exit 2
    ;;
esac
