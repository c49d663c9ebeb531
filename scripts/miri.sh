#!/usr/bin/env bash
# Miri over the pure data structures of aio-core, where undefined behaviour would hide: the
# generation slot store (slots.rs), the plug/batch queue (kit/queue.rs), the in-flight
# table's bookkeeping and the iovecs it builds (kit/inflight.rs, kit/transfer.rs),
# AlignedBuf (engine/buf.rs) and LentMemory (engine/lent.rs).
# Needs the nightly toolchain with miri (`rustup +nightly component add miri`); without it,
# says `skipped:` and exits 0. Builds in target/miri, so the normal build is untouched.
# Isolation is off only so that a test can open /dev/null for a request's file.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "skipped: miri: the nightly toolchain with the miri component is not installed" \
        "(rustup toolchain install nightly --component miri)"
    exit 0
fi
# `an_abandoned_table_frees_nothing` leaks on purpose (an abandoned table keeps the memory
# the kernel may still write, for good): it runs alone with Miri's leak check off, every other
# test with it on.
leaky=kit::inflight::tests::an_abandoned_table_frees_nothing
flags="-Zmiri-disable-isolation ${MIRIFLAGS:-}"
MIRIFLAGS="$flags" cargo +nightly miri test -p aio-core --lib -- \
    slots:: kit::queue kit::transfer kit::inflight engine::buf engine::lent --skip "$leaky" "$@"
MIRIFLAGS="$flags -Zmiri-ignore-leaks" cargo +nightly miri test -p aio-core --lib -- \
    --exact "$leaky"
