//! # aio-backend-uring (not implemented yet)
//!
//! This crate will hold the io_uring `IoEngine`, an `EventLoop` over `IORING_OP_POLL_ADD`, the
//! shared-ring mode in which block I/O completions need no eventfd, and a probe that says
//! whether io_uring is usable on this kernel and why not. It is tracked by the project's
//! io_uring issue. Nothing here works today; the crate exists so that the workspace layout is
//! complete.
