//! # aio-backend-linux-aio
//!
//! An [`IoEngine`](aio_core::engine::IoEngine) over Linux native AIO (`io_setup` / `io_submit` / `io_getevents`, called
//! through `libc::syscall`, no libaio).
//!
//! * **Completions** are signalled by an eventfd (`IOCB_FLAG_RESFD` on every iocb) and read
//!   straight from the completion ring the kernel maps into our address space (head and tail
//!   with acquire/release ordering; `io_getevents` only where the ring layout is unknown). The
//!   same two loads are the `io_poll` check: no syscall.
//! * **Capacity**: a ring of 1024 events by default ([`LinuxAioConfig::ring_size`]); requests
//!   beyond what the ring can hold queue and go out as completions free slots. Submission is
//!   batched: at most `max_batch` (32) iocbs per `io_submit`, never more than the free slots,
//!   sized by aio-core's batch rule ([`aio_core::kit::queue`], "The batch rule": no larger than the kernel's work).
//! * **io_submit errors**: `EAGAIN` leaves everything queued and retries on the next
//!   completion (or the next `poll_completions`); any other error fails only the request at the
//!   head, and the rest go on. A partial submission keeps the unsent tail, in order.
//! * **Whole transfers**: short reads and writes are resubmitted for the remainder (a read at
//!   EOF completes with what exists); `-EAGAIN` / `-EINTR` results are resubmitted. Vectored
//!   requests use `IOCB_CMD_PREADV` / `PWRITEV`.
//! * **Guest memory and flags**: reads and writes of memory the caller lends
//!   ([`LentMemory`](aio_core::engine::LentMemory)) go to the kernel as they are, with no copy;
//!   [`RwFlags`](aio_core::engine::RwFlags) become `aio_rw_flags` (`RWF_DSYNC` for FUA, `RWF_NOWAIT`; a kernel or file
//!   that refuses one completes the request with `EOPNOTSUPP`, kind `Unsupported`).
//! * **Discard and write-zeroes**: the kernel's AIO has no `fallocate`, so they are refused
//!   with [`RequestError::Unsupported`](aio_core::engine::RequestError::Unsupported), which [`WithFallback`](aio_core::engine::WithFallback) turns into a
//!   hand-over to a second engine (QEMU sends them to its thread pool even with
//!   `aio=native`): `WithFallback::new(LinuxAio::new(config)?, ThreadPool::new(pool_config)?)`.
//! * **fsync / fdatasync** use `IOCB_CMD_FSYNC` / `IOCB_CMD_FDSYNC` (Linux 4.18+). Where the
//!   kernel or file system lacks them the request completes with `EINVAL` from the kernel; the
//!   pool engine is the fallback for such files.
//! * **Buffered files**: io_submit on a file opened without `O_DIRECT` does the I/O inside the
//!   syscall, so the loop blocks. [`BufferedPolicy::Count`] (the default) accepts such
//!   requests and counts them in [`LinuxAioStats::buffered_requests`] (a library never prints);
//!   [`BufferedPolicy::Refuse`] refuses them with [`RequestError::Unsupported`](aio_core::engine::RequestError::Unsupported).
//! * **Limits**: `io_setup` failing with `EAGAIN` (the system-wide `aio-max-nr` is used up) is
//!   [`LinuxAioError::AioMaxNr`], which names `/proc/sys/fs/aio-max-nr` and the numbers.
//! * **Cancel** ([`IoEngine::cancel`](aio_core::engine::IoEngine::cancel)) reaches requests still queued in the engine. A read or
//!   write already in the kernel cannot be cancelled: `io_cancel` finds only requests that
//!   registered a cancel function, which the kernel's AIO gives poll and USB-gadget requests,
//!   never reads and writes (`EINVAL`); such a request completes normally, and a dropped
//!   future's memory stays with the engine until it does.
//! * **Drop** cancels what is still queued and waits for everything the kernel holds before
//!   the buffers are freed.
//!
//! ```no_run
//! use aio_backend_linux_aio::{LinuxAio, LinuxAioConfig};
//! use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request};
//! use std::os::unix::fs::OpenOptionsExt;
//!
//! let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
//! let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open("disk.img").unwrap();
//! let file = IoFile::from(f);
//! engine.submit(Request::read(&file, 0, AlignedBuf::new(4096), 1)).unwrap();
//! let done = engine.drain();
//! assert_eq!(done[0].token, 1);
//! ```

mod abi;
mod config;
mod engine;
mod error;
mod probe;
mod stats;

pub use config::{BufferedPolicy, LinuxAioConfig};
pub use engine::LinuxAio;
pub use error::LinuxAioError;
pub use probe::probe;
pub use stats::LinuxAioStats;
