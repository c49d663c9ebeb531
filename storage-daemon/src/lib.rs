//! # aio-storage-daemon
//!
//! The storage daemon of aio-rs, as qemu-storage-daemon sits over QEMU's block layer and its
//! exports: disk images opened by the block layer (`aio-block`, `aio-virtio-blk`'s device),
//! served over vhost-user-blk (`aio-vhost-user-blk`) and NBD (`aio-nbd`) on aio-rs iothreads,
//! driven by a command line (ours, or qemu-storage-daemon's) and by QMP.
//!
//! * [`daemon::run`]: a [`daemon::Config`]'s disks served until a [`daemon::StopHandle`]
//!   says stop; no signal handler, no command line. The images are locked as QEMU locks them
//!   (`aio_block::lock`), so QEMU's tools and other daemons see the disks' use of them.
//! * [`daemon::ExportKind`]: the kinds of export an image is served through (vhost-user-blk,
//!   NBD); [`daemon::NbdService`]: the NBD server and its exports.
//! * [`cli`] (feature `cli`, on by default): the `aio-storage-daemon` command line and its
//!   signals, `--daemonize` and `--pidfile`.
//! * [`qsd`] (feature `cli`): qemu-storage-daemon's command line, read into a
//!   [`daemon::Config`], so that an existing qemu-storage-daemon script runs with this daemon
//!   in its place.
//! * [`qmp`] (feature `cli`): QEMU's QMP on the daemon's monitor sockets: queries, block
//!   nodes and exports added and removed at run time, iothreads' polling set.
//! * [`job`]: block jobs' lifecycle, QEMU's states, transitions and verbs (the rules the
//!   job commands and events are built on).
//!
//! The binary is `aio-storage-daemon`; `aio-vhost-user-blk`, its name before this crate, is
//! the same program for one release.
//!
//! Serving a disk from your own program:
//!
//! ```no_run
//! use aio_storage_daemon::daemon::{run, Config, StopHandle};
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
mod blockdev;
#[cfg(feature = "cli")]
pub mod cli;
pub mod daemon;
pub mod job;
#[cfg(feature = "cli")]
pub mod qmp;
#[cfg(feature = "cli")]
pub mod qsd;
