//! # aio-core
//!
//! The contracts of aio-rs, a Rust rebuild of QEMU's `AioContext`, and the kit their
//! implementers share. The loop over them is `aio-loop`; the suite every implementation runs is
//! `aio-conformance`; the facade `aio` puts them together with the backends.
//!
//! * [`Notifier`]: a cross-thread wake-up object with a pollable fd (eventfd, pipe fallback).
//! * [`EventLoop`]: the fd-monitor contract a backend implements (`aio-backend-poll`,
//!   `aio-backend-epoll`, `aio-backend-uring`), written out on the trait.
//! * [`engine`]: the block I/O contract, [`IoEngine`] and [`Completion`] (read, write, readv,
//!   writev, fsync, fdatasync, discard, write-zeroes on an [`IoFile`](engine::IoFile), FUA and
//!   NOWAIT as [`RwFlags`](engine::RwFlags); buffers owned by the engine while in flight, or
//!   memory the caller lends with [`LentMemory`](engine::LentMemory)), written out in
//!   the module docs; [`WithFallback`](engine::WithFallback) sends what one engine lacks to
//!   another.
//! * [`AioError`]: the typed errors of the loop and of the monitors.
//! * [`kit`]: for backend authors only: the queue, in-flight table, slot store and helpers
//!   every engine and monitor shares, so that none writes them twice. A user of the loop and
//!   the engines needs none of it.
//!
//! A request is built and checked without any loop:
//!
//! ```
//! use aio_core::engine::{AlignedBuf, IoFile, Request, RwFlags};
//! # fn demo(disk: &IoFile) {
//! let buf = AlignedBuf::from_slice(&[0; 4096]);
//! let request = Request::write(disk, 0, buf, 3).with_flags(RwFlags::FUA);
//! assert_eq!(request.token, 3);
//! # }
//! ```

#![warn(missing_docs)]

pub mod engine;
mod error;
mod event_loop;
pub mod kit;
mod notifier;
mod slots;
mod sys;

/// The old name of [`kit`], kept for one release.
#[doc(hidden)]
pub use kit as backend;

pub use engine::{Completion, IoEngine};
pub use error::AioError;
pub use event_loop::{Event, EventLoop, Interest, Token};
pub use notifier::{Notifier, NotifierKind};
