//! `aio-bench vhost`: a vhost-user-blk client on libblkio, and our daemon beside
//! qemu-storage-daemon.
//!
//! The client ([`client`], a thread per queue in [`queue`]) drives one vhost-user-blk socket
//! through libblkio's `virtio-blk-vhost-user` driver, as a guest's virtio-blk driver would: per
//! virtqueue one thread keeps `iodepth` requests in flight in a memory region shared with the
//! daemon, and waits for completions on the queue's completion fd (`poll(2)`, then a
//! non-blocking `do_io`: QEMU's `block/blkio.c` interrupt mode, never busy polling). It reports
//! IOPS, MB/s, latency (mean, p50, p99) and the daemon's CPU time per request, read from
//! `/proc/PID/stat` ([`aio::process::cpu_time`]) around the measured window.
//!
//! [`daemons`] starts and stops the two daemons on the same image (qemu-storage-daemon with
//! one IOThread and a vhost-user-blk export per disk, and ours, the `aio-bench` binary
//! re-executed as `aio-bench vhost-daemon`), pinned to one CPU, each killed when the bench
//! is interrupted. [`compare`] runs them one at a time, alternating, round after round, and
//! prints the medians and the ratios ours/QEMU (and, with several disk counts, each count
//! against one disk).
//!
//! What the client runs is [`spec`]'s [`ClientSpec`]; what fails is [`error`]'s
//! [`VhostError`].
//!
//! This module owns the vhost-user side of the bench only; the command line is
//! `cmd::vhost` in the binary.

pub mod client;
pub mod compare;
pub mod daemons;
pub mod error;
pub mod queue;
pub mod spec;

pub use client::{run_client, ClientResult};
pub use error::VhostError;
pub use spec::{ClientSpec, MAX_IODEPTH};
