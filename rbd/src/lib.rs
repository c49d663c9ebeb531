//! # aio-rbd
//!
//! Ceph RBD images on aio-rs's loops: librbd's asynchronous API, with each request's end
//! delivered on the loop of the context that submitted it, as QEMU's `block/rbd.c` schedules
//! a bottom half into the request's `AioContext`.
//!
//! * [`Cluster`]: a connection ([`ClusterOptions`]: a configuration file, a user and key,
//!   monitors, `client_mount_timeout`), with typed errors for an unreachable cluster, a
//!   refused key, a missing pool.
//! * [`RbdImage`]: an image ([`ImageSpec`]: pool, namespace, image, snapshot; QEMU's `rbd:`
//!   filename as [`RbdTarget`]) opened read-write or read-only, its size, resize, block
//!   status ([`RbdImage::allocated`]), the exclusive lock ([`RbdImage::lock_exclusive`],
//!   [`LockRecords`]), and a close that waits for every request in flight first.
//! * [`RbdQueue`]: one context's requests (read and write straight from and into the
//!   memory the caller lends, [`LentMemory`], FUA, flush, discard, write-zeroes) on that
//!   context's loop.
//! * [`RbdImage::submit`]: one request ([`RbdOp`]) as a future ([`RbdFuture`]) for an
//!   executor of the caller's, woken from librbd's thread.
//!
//! The contract:
//!
//! * **librbd is loaded at run time.** Nothing links against Ceph's libraries; the first
//!   connection loads `librbd.so.1` and `librados.so.2`, and a machine without them gets
//!   [`RbdError::LibraryMissing`] naming the package (`librbd1`), never a link error.
//! * **Ends come home.** A request submitted on a queue ends on that queue's context, in a
//!   bottom half, never inside the submitting call and never on librbd's threads.
//! * **Memory librbd may write is never freed early.** A request's [`LentMemory`] is held by the
//!   request until librbd's callback, whatever happens to the queue meanwhile.
//! * **No close under requests.** An image closes (explicitly or dropped) only after every
//!   request librbd holds has called back.
//! * **Blocking calls are named.** Connecting, opening, resizing, locking and
//!   [`RbdImage::allocated`] wait for the cluster; [`RbdQueue::allocated`] runs the latter on
//!   the image's worker thread instead.
//!
//! ```no_run
//! use std::sync::Arc;
//! use aio_rbd::{Cluster, ClusterOptions, ImageSpec, LentMemory, RbdImage, RbdQueue};
//! # fn demo<L: aio_core::EventLoop + 'static>(ctx: &aio_loop::AioContext<L>) -> Result<(), aio_rbd::RbdError> {
//! let cluster = Cluster::connect(&ClusterOptions::from_conf("/etc/ceph/ceph.conf", "admin"))?;
//! let image = RbdImage::open(&cluster, &"rbd/disk0".parse::<ImageSpec>()?, false)?;
//! let queue = RbdQueue::new(image, ctx);
//! queue.write(0, LentMemory::from_vec(vec![0x5a; 4096]), true, |result, _memory| {
//!     result.expect("written and flushed");
//! });
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod cluster;
mod diff;
mod error;
mod future;
mod image;
mod lock;
mod queue;
mod spec;
mod submit;
mod sys;
#[cfg(feature = "testing")]
pub mod testing;

pub use aio_core::engine::LentMemory;
pub use cluster::Cluster;
pub use error::RbdError;
pub use future::RbdFuture;
pub use image::RbdImage;
pub use lock::{LockRecords, LockTaken};

/// The old name of a request's memory, for one release: it is [`LentMemory`] now (aio-core's,
/// the one type every layer lends memory with). `Memory::new(iov, owner)` is
/// `LentMemory::new(segments, Some(hold))` with the owner as an `Arc` hold; `into_vec` returns
/// a `Result` (the memory back when it is no vector, or still held elsewhere), and
/// `into_parts` is gone (`hold()` lends the hold on).
#[deprecated(note = "use `LentMemory` (aio_core::engine::LentMemory)")]
pub type Memory = LentMemory;
pub use queue::RbdQueue;
pub use spec::{ClusterOptions, ImageSpec, RbdTarget};
pub use submit::RbdOp;
pub use sys::librbd_version;
