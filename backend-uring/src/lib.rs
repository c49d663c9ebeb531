//! # aio-backend-uring
//!
//! io_uring for aio-rs, through the `io-uring` crate:
//!
//! * [`UringEngine`]: an [`IoEngine`](aio_core::engine::IoEngine) — read, write, readv, writev, fsync,
//!   fdatasync; a ring of 128 entries by default; batched submission (max batch 32); a full
//!   submission queue queues instead of failing; completions signalled through a registered
//!   eventfd, and found without a syscall by peeking at the completion queue (the `io_poll`
//!   check); completion-queue overflow loses nothing (the kernel keeps overflowed CQEs,
//!   `IORING_FEAT_NODROP`, and the engine flushes them; on kernels without it the engine never
//!   has more in flight than the CQ holds); short reads and writes, `-EAGAIN` and `-EINTR` are
//!   resubmitted; registered files ([`UringConfig::register_files`]) and registered ("fixed")
//!   buffers ([`UringConfig::fixed_buffers`]: each buffer allocation registered on first use
//!   and kept while requests bring it back) as options; drop waits for everything in flight.
//! * [`UringLoop`]: an [`EventLoop`](aio_core::EventLoop) over `IORING_OP_POLL_ADD`, one-shot
//!   polls re-armed at each wait (which keeps the contract's level-triggered semantics), safe
//!   removal while a poll is outstanding (stale completions are recognised by a generation and
//!   ignored), nanosecond timeouts through `IORING_ENTER_EXT_ARG` (or a `TIMEOUT` entry on
//!   kernels without it).
//! * [`shared_ring`]: one ring for both the monitor and the engine (QEMU's newest design): block
//!   I/O completions land in the completion queue the monitor waits on, so they need no eventfd
//!   and no extra wakeup; the monitor reports the engine's (never written) notifier fd readable
//!   when engine completions wait.
//! * [`probe`](fn@probe): whether io_uring is usable here and, if not, why
//!   (`kernel.io_uring_disabled`, `EPERM` from seccomp, `ENOSYS`, `ENOMEM` from the memlock
//!   limit), and which opcodes exist.
//!
//! ```no_run
//! use aio_backend_uring::{probe, UringConfig, UringEngine};
//! match probe() {
//!     Ok(support) => println!("io_uring ok, opcodes: {:?}", support.opcodes),
//!     Err(why) => println!("io_uring unusable: {why}"),
//! }
//! let engine = UringEngine::new(UringConfig::default()).unwrap();
//! ```

mod engine;
mod monitor;
mod probe;
mod registered_buffers;
mod ring;
mod task_run;

pub use engine::{UringConfig, UringEngine, UringStats, MAX_ENTRIES, REGISTERED_FILES};
pub use monitor::{shared_ring, UringLoop};
pub use probe::{probe, UringSupport, UringUnavailable};
pub use registered_buffers::MAX_REGISTERED_BUFFERS;
pub use task_run::TaskRun;
