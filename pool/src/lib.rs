//! # aio-pool (not implemented yet)
//!
//! This crate will hold QEMU's `aio=threads`: a thread pool that is an `IoEngine` (blocking
//! `preadv` / `pwritev` / `fsync` in workers, completions signalled through a `Notifier` plus an
//! `io_poll` check) and a general `submit(FnOnce() -> T)` offload whose result comes back in
//! the loop. It is tracked by the project's I/O-engine issue. Nothing here works today; the
//! crate exists so that the workspace layout is complete.
