#!/usr/bin/env bash
# The loom models of the cross-thread protocols, every interleaving explored:
#   aio-loop: the notify_me handshake and bottom-half scheduling (no lost wake-up, each
#             schedule runs once)            -> loop/src/context/wakeup.rs
#   aio-pool: the idle accounting and spawn decision (QEMU's thread-pool idle-thread
#             accounting: no stranded job, the counters return to zero)
#                                            -> pool/src/loom_model.rs
# Built with `--cfg aio_loom` in a separate target dir (target/loom), so the normal build is
# untouched. Takes a few minutes on 2 cores, most of it compiling.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg aio_loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
# Bounded preemptions keep the pool models to about a minute; LOOM_MAX_PREEMPTIONS= (empty)
# explores without a bound (about 10 minutes).
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS-3}"
[ -n "$LOOM_MAX_PREEMPTIONS" ] || unset LOOM_MAX_PREEMPTIONS
exec cargo test --release -p aio-loop -p aio-pool --lib loom_model "$@"
