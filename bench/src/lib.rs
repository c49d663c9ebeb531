//! # aio-bench
//!
//! The project's benchmark crate, behind the `aio-bench` binary:
//!
//! * backend selection by name and `auto` ([`monitors`], [`engines`]);
//! * the scsi-disk scaling matrix from the QEMU epoll discussion, 1..256 disks on one IOThread
//!   or spread over several ([`scsi`] for one cell, [`matrix`] for the axes and the reports),
//!   with `--verify` stamps ([`verify`]) on images ([`image`]);
//! * the fio-like load generator ([`job`]), fio job files ([`jobfile`]) and their runs in fio's
//!   formats ([`runner`]), fio itself for side-by-side runs ([`fio`]), fio's units ([`units`]);
//! * the fast device, a loop device with direct I/O over a file in `/dev/shm` ([`loopdev`]),
//!   and undoing a run's setup on signals too ([`cleanup`]);
//! * the vhost-user-blk client on libblkio, and starting our daemon and qemu-storage-daemon
//!   side by side ([`vhost`]);
//! * the command line's pieces: `--cpus` ([`cpus`]), progress lines ([`progress`]), the
//!   `probe` report ([`probe`]), and the one error type with its exit codes ([`error`]).
//!
//! It also runs the conformance suite against the hybrid monitor (which needs both
//! backend-poll and backend-epoll, so it cannot live in either of them).

pub mod cleanup;
pub mod cpus;
pub mod engines;
pub mod error;
pub mod fio;
pub mod image;
pub mod job;
pub mod jobfile;
pub mod loopdev;
pub mod matrix;
pub mod monitors;
pub mod mounted;
pub mod probe;
pub mod progress;
pub mod runner;
pub mod scsi;
pub mod units;
pub mod verify;
pub mod vhost;
