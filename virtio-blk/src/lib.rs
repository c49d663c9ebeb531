//! # aio-virtio-blk
//!
//! A virtio-blk device on aio-rs, apart from any transport: what a VMM embeds with its own
//! virtio transport (PCI, MMIO), and what `aio-vhost-user-blk` serves over vhost-user. It
//! depends on the rust-vmm crates for the ring and guest memory (`virtio-queue`,
//! `vm-memory`, `virtio-bindings`), on `aio-core` for the loop and the engines, and on
//! `aio-block` for the images and their request path (qcow2 with the feature `qcow2`, on by
//! default); never on a transport, a command line or signals. `aio-block` knows nothing of
//! virtio: a chain becomes a block-layer request here.
//!
//! * [`spec`]: the specification's numbers (from `virtio-bindings`) and the config space.
//! * [`device::BlockDevice`]: a disk over an [`aio_block::Image`] (a raw file or block
//!   device, a qcow2 image and its backing chain, or the null device; opened here, or shared
//!   with another export through [`BlockDevice::on_image`](device::BlockDevice::on_image)),
//!   its serial, its queues, the feature bits and config space it offers.
//! * [`format`](mod@format) and [`stats`]: `aio-block`'s format probe and I/O statistics,
//!   re-exported.
//! * [`chain::parse_chain`]: a descriptor chain checked against the memory table, the queue,
//!   the directions and the capacity before anything is touched; a bad one is
//!   `VIRTIO_BLK_S_IOERR` (an unknown type `VIRTIO_BLK_S_UNSUPP`), never a panic.
//! * [`queue::VirtioBlkQueue`]: one virtqueue served on one context: kicks as fd handlers,
//!   `io_poll` on the avail index and guest notifications off while the iothread polls; one
//!   interrupt per batch of completions through [`aio_loop::AioContext::deferred_call`]. The
//!   requests themselves run on the disk's image through `aio-block`'s
//!   [`ImageQueue`](aio_block::ImageQueue) (`request.rs`: `IN`/`OUT` straight into and out of
//!   guest memory, `FLUSH`, `DISCARD`, `WRITE_ZEROES`; `GET_ID` answered here).
//! * [`inflight::InflightLog`]: the contract of an in-flight log (each head marked before its
//!   request is submitted, cleared once its used element is published) and the heads a queue
//!   resubmits at its start, for a transport whose backend restarts under a running guest.
//! * [`dirty::DirtyLogger`]: the guest memory the device wrote (data, status bytes, the used
//!   ring), reported by guest-physical address for a transport that tracks dirty pages while
//!   a running guest migrates (vhost-user's `VHOST_F_LOG_ALL`).
//! * [`dataplane::DataPlane`]: what one iothread holds (its engine, its queues), and
//!   [`dataplane::iothread_of`], the rule that spreads queues over iothreads.
//! * `driver::SplitRingDriver` (feature `test-utils`, off by default): the guest's side of a
//!   queue in this process (descriptors, avail ring, kick, interrupt, used ring), for tests,
//!   benchmarks and examples that run the real device without a guest.
//!
//! A VMM serves a queue it set up itself (the guest memory as `vm-memory` regions, the ring
//! addresses, the kick and call eventfds):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use aio_loop::AioContext;
//! # use aio_core::{EventLoop, IoEngine};
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
pub mod dirty;
#[cfg(feature = "test-utils")]
pub mod driver;
/// The image format probe: moved to [`aio_block::format`], re-exported here.
pub use aio_block::format;
pub mod inflight;
pub mod queue;
mod request;
pub mod spec;
/// The I/O statistics: moved to [`aio_block::stats`] (they are the image's), re-exported here.
pub use aio_block::stats;
