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
export MIRIFLAGS="-Zmiri-disable-isolation ${MIRIFLAGS:-}"
exec cargo +nightly miri test -p aio-core --lib -- \
    slots:: kit::queue kit::transfer kit::inflight engine::buf engine::lent "$@"
