//! The scsi-disk scaling test from the QEMU epoll discussion (1..256 disks on one IOThread),
//! in process, on the real device: `aio-virtio-blk`'s queues served on iothreads, guests
//! driving them through split rings in guest memory.
//!
//! This module owns one cell's run:
//!
//! * a **disk** is a backing image (an O_DIRECT file, or a region of a block device, served
//!   as a window of it: [`BlockDevice::window`](aio_virtio_blk::device::BlockDevice::window))
//!   and `queues` virtqueues, each an `aio-virtio-blk` [`VirtioBlkQueue`] with its kick
//!   eventfd registered in one iothread's context (idle disks' too: that is what the QEMU
//!   test measures), its requests straight into guest memory, one interrupt per batch of
//!   completions, and notifications off while the iothread polls;
//! * the **guest** is one load-generator thread per active disk, keeping `iodepth` requests in
//!   flight, as fio does in the guest, through the disk's
//!   [`SplitRingDriver`](aio_virtio_blk::driver::SplitRingDriver)s: descriptors and the avail
//!   ring written in guest memory, kicks, interrupts, the used ring (`scsi/guest.rs`);
//! * an **iothread** is one [`AioContext`](aio_loop::AioContext) over the chosen monitor with
//!   the chosen engine attached through a [`DataPlane`](aio_virtio_blk::dataplane::DataPlane),
//!   as the daemon runs one. With `iothreads` K, queue `q` of disk `d` is served by iothread
//!   `(d * queues + q) % K` ([`iothread_of`], the daemon's rule), each iothread an
//!   [`aio_loop::IoThread`] that builds its monitor and engine on itself.
//!
//! A cell is three steps (`scsi/run.rs`): set up (the devices and both sides of every queue,
//! the iothreads with their engines attached and their queues started, then the guests),
//! drive (until every guest is done) and collect (the guests' figures, and each iothread's
//! counters, interrupts and CPU time). It never touches a backend's internals: only the
//! `EventLoop` and `IoEngine` traits.
//!
//! [`VirtioBlkQueue`]: aio_virtio_blk::queue::VirtioBlkQueue
mod guest;
mod result;
mod run;
mod spec;

pub use self::result::{CellResult, IothreadFigures};
pub use self::run::{run_cell, run_cell_on_iothreads};
pub use self::spec::{iothread_of, CellSpec, GuestSched, MemoryPath};
