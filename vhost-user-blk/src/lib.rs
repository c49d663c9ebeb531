//! # aio-vhost-user-blk
//!
//! A virtio-blk device on aio-rs, and the vhost-user-blk daemon that serves it to QEMU,
//! cloud-hypervisor or libblkio. The protocol and the rings come from the rust-vmm crates
//! (`vhost`, `virtio-queue`, `vm-memory`); the loop is aio-rs's: the vhost-user sockets are
//! handlers of the daemon's control `AioContext`, and every queue's kick eventfd and every
//! engine's completions are handlers of one `AioContext` per iothread ([`aio_core::IoThread`]).
//!
//! * [`device::BlockDevice`]: an image (a file or a block device, `O_DIRECT`), its
//!   capacity, serial, read-only flag, the feature bits and config space it offers.
//! * [`format::probe`]: an image's format from its first bytes (QEMU's probe): an image
//!   whose header is qcow2's, QED's, VMDK's, VDI's, VHDX's, VHD's, Parallels' or LUKS's is
//!   refused unless the disk says `format=raw`, so no such file is served as raw by mistake.
//! * [`chain::parse_chain`]: a descriptor chain checked against the memory table, the queue,
//!   the directions and the capacity before anything is touched; a bad one is
//!   `VIRTIO_BLK_S_IOERR` (an unknown type `VIRTIO_BLK_S_UNSUPP`), never a panic.
//! * [`queue::VirtioBlkQueue`]: one virtqueue served on one context, reusable apart from
//!   vhost-user by a VMM with its own transport: `IN`/`OUT` straight into and out of guest
//!   memory, `FLUSH`, `GET_ID`, `DISCARD`, `WRITE_ZEROES`; `io_poll` on the avail index and
//!   guest notifications off while the iothread polls; one interrupt per batch of
//!   completions through [`aio_core::AioContext::deferred_call`].
//! * [`vhost::BlkBackend`]: the vhost-user-blk device state of one connection (features,
//!   memory table, vrings), driven by the `vhost` crate's request handler.
//! * [`daemon`]: `aio-vhost-user-blk --disk socket=PATH,image=PATH ...`.
//!
//! Serving a disk from your own program (the daemon's whole command line as a struct):
//!
//! ```no_run
//! use aio_vhost_user_blk::daemon::{run, Args};
//! use clap::Parser;
//!
//! let args = Args::parse_from([
//!     "my-vmm",
//!     "--disk", "socket=/tmp/vhost.sock,image=/var/lib/disk.img,serial=disk0,queues=2",
//!     "--engine", "uring",
//!     "--iothreads", "2",
//! ]);
//! run(&args)?; // until SIGINT or SIGTERM
//! # Ok::<(), aio_vhost_user_blk::daemon::DaemonError>(())
//! ```
//!
//! A VMM with its own virtio transport serves a queue it set up itself (the guest memory as
//! `vm-memory` regions, the ring addresses, the kick and call eventfds):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use aio_core::{AioContext, EventLoop};
//! # use aio_core::engine::{IoEngine};
//! # use aio_vhost_user_blk::{device::BlockDevice, queue::VirtioBlkQueue};
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

pub mod backends;
pub mod chain;
pub mod daemon;
pub mod dataplane;
pub mod device;
pub mod format;
pub mod memory;
pub mod queue;
pub mod spec;
pub mod vhost;
