//! # aio-vhost-user-blk
//!
//! The vhost-user transport for [`aio_virtio_blk`]'s device, and the daemon that serves it to
//! QEMU, cloud-hypervisor or libblkio. The protocol comes from the rust-vmm `vhost` crate; the
//! loop is aio-rs's: the vhost-user sockets are handlers of the daemon's control
//! `AioContext`, and every queue's kick eventfd and every engine's completions are handlers
//! of one `AioContext` per iothread ([`aio_core::IoThread`]).
//!
//! * [`vhost::BlkBackend`]: the vhost-user-blk device state of one connection (features,
//!   memory table, vrings), driven by the `vhost` crate's request handler.
//! * [`memory::MemoryTable`]: the frontend's memory regions, mapped.
//! * [`inflight`]: vhost-user's in-flight I/O tracking: the shared region that tells a daemon
//!   restarted under a running guest which requests to run again, validated before use.
//! * [`daemon::run`]: a [`daemon::Config`]'s disks served until a [`daemon::StopHandle`]
//!   says stop; no signal handler, no command line.
//! * [`cli`] (feature `cli`, on by default): the `aio-vhost-user-blk` command line and its
//!   signals.
//! * [`qsd`] (feature `cli`): qemu-storage-daemon's command line for vhost-user-blk exports,
//!   read into a [`daemon::Config`], so that an existing qemu-storage-daemon script runs with
//!   this daemon in its place.
//! * [`qmp`] (feature `cli`): QEMU's QMP on the daemon's monitor sockets: queries, block
//!   nodes and exports added and removed at run time, iothreads' polling set.
//! * `testing` (feature `testing`): the daemon started as a child process and a libblkio
//!   client of its socket, for tests and benches.
//!
//! Serving a disk from your own program:
//!
//! ```no_run
//! use aio_vhost_user_blk::daemon::{run, Config, StopHandle};
//!
//! let disk = "socket=/tmp/vhost.sock,image=/var/lib/disk.img,serial=disk0,queues=2".parse()?;
//! let mut config = Config::new(vec![disk]);
//! config.engine = "uring".parse()?;
//! config.iothreads = 2;
//! let stop = StopHandle::new();
//! let stopper = stop.clone(); // stop.stop() from any thread ends `run`
//! # drop(stopper);
//! run(&config, &stop)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod daemon;
pub mod inflight;
pub mod memory;
#[cfg(feature = "cli")]
pub mod qmp;
#[cfg(feature = "cli")]
pub mod qsd;
#[cfg(feature = "testing")]
pub mod testing;
pub mod vhost;
