//! # aio-bench
//!
//! The project's benchmark crate, behind the `aio-bench` binary:
//!
//! * backends by name, `auto` and the `probe` report come from the `aio` crate;
//! * what runs read and write: images, the fast device (a loop device with direct I/O over a
//!   file in `/dev/shm`), undoing a run's setup on signals, the mount checks ([`targets`]);
//! * what every workload needs: offsets, the RNG, the read/write mix, the latency histogram,
//!   the measured window, the verify stamps ([`load`]);
//! * fio's side: fio itself for side-by-side runs, job files, the fio-like job on an attached
//!   engine, job files run through our engines, fio's output formats ([`fio`]), fio's units
//!   ([`units`]);
//! * the scsi-disk scaling matrix from the QEMU epoll discussion, 1..256 disks on one IOThread
//!   or spread over several ([`scsi`] for one cell, [`matrix`] for the axes and the reports);
//! * the vhost-user-blk client on libblkio, and starting our daemon and qemu-storage-daemon
//!   side by side ([`vhost`]);
//! * the command line's pieces: `--cpus` ([`cpus`]), progress lines ([`progress`]), and the
//!   one error type with its exit codes ([`error`]).

pub mod cpus;
pub mod error;
pub mod fio;
pub mod flags;
pub mod load;
pub mod matrix;
pub mod progress;
pub mod rounds;
pub mod scsi;
pub mod targets;
pub mod units;
pub mod vhost;
