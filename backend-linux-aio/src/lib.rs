//! # aio-backend-linux-aio (not implemented yet)
//!
//! This crate will hold the `IoEngine` over Linux native AIO: `io_setup` / `io_submit` /
//! `io_getevents` through `libc::syscall`, completions signalled by an eventfd
//! (`IOCB_FLAG_RESFD`) and read from the kernel's AIO ring in user space. It is tracked by the
//! project's issue on the Linux AIO engine and depends on the `IoEngine` contract that
//! `aio-core` does not define yet. Nothing here works today; the crate exists so that the
//! workspace layout is complete.
