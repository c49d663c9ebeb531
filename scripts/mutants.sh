#!/usr/bin/env bash
# Mutation testing with cargo-mutants (crates.io): each mutant is the code with one change
# (a return value, an operator, a deleted match arm); a mutant the tests do not catch is
# "missed". Slow on 2 cores, so not part of .ci/run: run it after changing one of the paths
# below, and record what it missed (and why each is caught since or equivalent) in
# docs/mutants.md.
#
#   scripts/mutants.sh            every group below
#   scripts/mutants.sh GROUP      one group: chain, core, engines, pool, linux-aio, uring, loop, context, types, load
#   MUTANTS_ARGS=--iterate scripts/mutants.sh GROUP
#                                 only the mutants the last run of GROUP did not catch
#
# Each group runs the tests of the crates that exercise its files, not the whole workspace:
# a mutant of aio-core's engine driver is caught by aio-core's own tests, one of the in-flight
# table by the Linux AIO engine's suite. MUTANTS_OUT picks the output folder.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
out=${MUTANTS_OUT:-target/mutants}
mkdir -p "$out"
# No debug info: the mutants' builds link faster, and nothing here needs a debugger.
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0
# The baseline runs only the tests of the mutated files' crate, so the timeout cargo-mutants
# sets from it (20 s here) can be shorter than a group's whole test run; a mutant the tests
# merely did not catch would then count as a timeout. The floor is well above every group's
# run (the engines group's is about 10 s without the loop-device suites).
timeout=${MUTANTS_TIMEOUT:-90}

run() { # group name, the packages whose tests run (comma-separated), then the files
    local group=$1 tests=$2
    shift 2
    local args=()
    for f in "$@"; do args+=(-f "$f"); done
    local pkgs=()
    IFS=, read -ra names <<<"$tests"
    for p in "${names[@]}"; do pkgs+=(--test-package "$p"); done
    # shellcheck disable=SC2086 # MUTANTS_ARGS is a list of flags
    cargo mutants --no-shuffle --minimum-test-timeout "$timeout" "${pkgs[@]}" "${args[@]}" \
        -o "$out/$group" ${MUTANTS_ARGS:-} || true
    echo "== $group: missed mutants"
    cat "$out/$group/mutants.out/missed.txt" 2>/dev/null || true
}

group() {
    case "$1" in
    chain)
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib" run chain aio-virtio-blk virtio-blk/src/chain.rs
        ;;
    core)
        run core aio-core,aio-backend-linux-aio,aio-pool aio-core/src/engine/attached.rs aio-core/src/engine/fallback.rs \
            aio-core/src/context/defer.rs
        ;;
    engines)
        # The suites on loop devices run the same submit paths as on files, at four times the
        # cost, and the doc tests and examples only rebuild: left out here.
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib --tests -- --skip on_a_loop_device" \
            run engines aio-core,aio-backend-linux-aio,aio-backend-uring \
            aio-core/src/backend/inflight.rs aio-core/src/backend/queue.rs \
            aio-core/src/backend/round.rs
        ;;
    pool)
        run pool aio-core,aio-pool aio-core/src/backend/blocking.rs
        ;;
    linux-aio)
        # The engine's own submit, reap and drop, with its suites on files and loop devices
        # (the drop test needs a loop device).
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib --tests" \
            run linux-aio aio-backend-linux-aio backend-linux-aio/src/engine.rs
        ;;
    uring)
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib --tests" \
            run uring aio-backend-uring backend-uring/src/engine/mod.rs backend-uring/src/engine/entry.rs
        ;;
    loop)
        # The loop's iteration and its busy polling, with aio-core's own tests and the event
        # loop conformance suite (aio_core::testing, run by a monitor's crate: epoll's).
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib --tests" \
            run loop aio-core,aio-backend-epoll aio-core/src/context/iteration.rs \
            aio-core/src/context/busy_poll.rs
        ;;
    context)
        # The rest of the loop (defer.rs is the core group's).
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib --tests" \
            run context aio-core,aio-backend-epoll aio-core/src/context/bottom_half.rs aio-core/src/context/handlers.rs \
            aio-core/src/context/timers.rs aio-core/src/context/mod.rs aio-core/src/context/wakeup.rs \
            aio-core/src/context/notify.rs aio-core/src/context/counters.rs
        ;;
    types)
        # The request, buffer, file and completion types every engine shares, and the transfer
        # arithmetic of the in-flight table, with aio-core's tests (the Linux AIO engine's
        # suite adds 13 s a mutant: run it on what this misses, with --test-package and --re).
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib --tests" \
            run types aio-core aio-core/src/engine/buf.rs aio-core/src/engine/completion.rs \
            aio-core/src/engine/file.rs aio-core/src/engine/lent.rs aio-core/src/engine/mod.rs \
            aio-core/src/engine/request.rs aio-core/src/backend/transfer.rs
        ;;
    polling)
        # The polling window's arithmetic and the automatic window's model: pure functions of
        # the waits, tested on a fake clock by aio-core's lib tests alone.
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib" \
            run polling aio-core aio-core/src/polling/auto.rs aio-core/src/polling/mod.rs
        ;;
    load)
        # The bench's load generator and verify's ledger: their unit tests are the bench
        # library's (a disk in memory), the end-to-end runs cost more and add nothing here.
        MUTANTS_ARGS="${MUTANTS_ARGS:-} -- --lib" \
            run load aio-bench bench/src/load/generator.rs bench/src/load/verify.rs
        ;;
    *)
        echo "usage: scripts/mutants.sh [chain|core|engines|pool|linux-aio|uring|loop|context|types|polling|load]" >&2
        exit 2
        ;;
    esac
}

if [ $# -eq 0 ]; then
    for g in chain core engines pool linux-aio uring loop context types polling load; do group "$g"; done
else
    group "$1"
fi
