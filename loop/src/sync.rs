//! The atomics the loop's cross-thread protocols use: `std`'s, or `loom`'s when the crate is
//! built with `--cfg aio_loom` so that `loom` can explore every interleaving of those protocols
//! (see `scripts/loom.sh`).
//!
//! This module owns the switch only. Code that other threads reach through a protocol a loom
//! model checks (the notify_me handshake, the bottom-half state word) takes its atomics from
//! here; everything else uses `std` directly.

#[cfg(aio_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64};
#[cfg(not(aio_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64};
