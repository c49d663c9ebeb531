//! # aio-virtio-blk
//!
//! A virtio-blk device on aio-rs, apart from any transport: what a VMM embeds with its own
//! virtio transport (PCI, MMIO), and what `aio-vhost-user-blk` serves over vhost-user. It
//! depends on the rust-vmm crates for the ring and guest memory (`virtio-queue`,
//! `vm-memory`, `virtio-bindings`), on `aio-core` for the loop and the engines, and for qcow2
//! images (feature `qcow2`, on by default) on `imago`; never on a transport, a command line or
//! signals.
//!
//! * [`spec`]: the specification's numbers (from `virtio-bindings`) and the config space.
//! * [`device::BlockDevice`]: an image (a raw file or block device, `O_DIRECT`; a qcow2 image
//!   and its backing chain; or the null device), its capacity, serial, read-only flag, the
//!   feature bits and config space it offers.
//! * [`format::probe`]: an image's format from its first bytes (QEMU's probe): with
//!   `format=auto` a qcow2 header is served as qcow2, and one of QED, VMDK, VDI, VHDX, VHD,
//!   Parallels or LUKS is refused unless the disk says `format=raw`, so no such file is
//!   served as raw by mistake; a probed raw image refuses a write that would give it such a
//!   header. [`format::check_qcow2`] refuses encrypted qcow2 images and unknown incompatible
//!   features before they are opened.
//! * qcow2 (feature `qcow2`, on by default): served through the `imago` crate, whose storage
//!   does its I/O on the engine of the queue serving each request (guest buffers straight to
//!   the engine, metadata through engine-owned buffers); queues on several iothreads share one
//!   image. The raw path does not go through it.
//! * [`chain::parse_chain`]: a descriptor chain checked against the memory table, the queue,
//!   the directions and the capacity before anything is touched; a bad one is
//!   `VIRTIO_BLK_S_IOERR` (an unknown type `VIRTIO_BLK_S_UNSUPP`), never a panic.
//! * [`queue::VirtioBlkQueue`]: one virtqueue served on one context: kicks as fd handlers,
//!   `io_poll` on the avail index and guest notifications off while the iothread polls; one
//!   interrupt per batch of completions through [`aio_core::AioContext::deferred_call`]. The
//!   requests themselves run on the disk's backing store (`request.rs`: `IN`/`OUT` straight
//!   into and out of guest memory, a bounce buffer when misaligned, `FLUSH`, `GET_ID`,
//!   `DISCARD`, `WRITE_ZEROES`).
//! * [`inflight::InflightLog`]: the contract of an in-flight log (each head marked before its
//!   request is submitted, cleared once its used element is published) and the heads a queue
//!   resubmits at its start, for a transport whose backend restarts under a running guest.
//! * [`dataplane::DataPlane`]: what one iothread holds (its engine, its queues), and
//!   [`dataplane::iothread_of`], the rule that spreads queues over iothreads.
//! * [`driver::SplitRingDriver`]: the guest's side of a queue in this process (descriptors,
//!   avail ring, kick, interrupt, used ring), for tests, benchmarks and examples that run
//!   the real device without a guest.
//!
//! A VMM serves a queue it set up itself (the guest memory as `vm-memory` regions, the ring
//! addresses, the kick and call eventfds):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use aio_core::{AioContext, EventLoop, IoEngine};
//! # use aio_virtio_blk::{device::BlockDevice, queue::VirtioBlkQueue};
//! # fn demo<L: EventLoop + 'static, E: IoEngine + 'static>(
//! #     ctx: &AioContext<L>, engine: E, disk: BlockDevice, queue: virtio_queue::Queue,
//! #     memory: Arc<vm_memory::GuestMemoryMmap>, kick: std::fs::File, call: std::fs::File,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let engine = ctx.attach_engine(engine, |_, _| {})?;
//! let q = VirtioBlkQueue::start(ctx, engine, Arc::new(disk), queue, memory, kick, Some(call))?;
//! // ... the context's loop serves the queue ...
//! let next_avail = q.stop(ctx); // every request taken has completed
//! # let _ = next_avail; Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod chain;
pub mod dataplane;
pub mod device;
pub mod driver;
/// The image format probe: moved to [`aio_block::format`], re-exported here.
pub use aio_block::format;
#[cfg(feature = "qcow2")]
mod image;
pub mod inflight;
pub mod queue;
mod request;
pub mod spec;
pub mod stats;
