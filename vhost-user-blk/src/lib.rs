//! # aio-vhost-user-blk
//!
//! The vhost-user-blk transport for [`aio_virtio_blk`]'s device, as QEMU's
//! `block/export/vhost-user-blk-server.c` is for its block layer: what serves one disk over a
//! vhost-user socket to QEMU, cloud-hypervisor or libblkio. The protocol comes from the
//! rust-vmm `vhost` crate; the loop is aio-rs's: a disk's socket is a handler of a control
//! `AioContext`, and every queue's kick eventfd and every engine's completions are handlers
//! of one `AioContext` per iothread ([`aio_loop::IoThread`]). The daemon that serves disks
//! this way, with its command lines and QMP, is `aio-storage-daemon`.
//!
//! * [`server::DiskSocket`]: one disk's socket on a control loop: a frontend accepted at a
//!   time, its messages read by a fd handler, its queues drained when it goes.
//! * [`vhost::BlkBackend`]: the vhost-user-blk device state of one connection (features,
//!   memory table, vrings), driven by the `vhost` crate's request handler.
//! * [`memory::MemoryTable`]: the frontend's memory regions, mapped.
//! * [`inflight`]: vhost-user's in-flight I/O tracking: the shared region that tells a daemon
//!   restarted under a running guest which requests to run again, validated before use.
//! * [`log::DirtyLog`]: vhost-user's dirty log, the bitmap of guest pages the device wrote
//!   that a live migration copies again (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`,
//!   `VHOST_F_LOG_ALL`).
//! * `testing` (feature `testing`): a libblkio client of a daemon's socket, for tests and
//!   benches.
//!
//! `examples/serve_socket.rs` serves one image on one iothread with these pieces alone.

#![warn(missing_docs)]

pub mod inflight;
pub mod log;
pub mod memory;
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;
pub mod vhost;
