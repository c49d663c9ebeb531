//! # aio-pool
//!
//! QEMU's `aio=threads`: a thread pool that is an [`IoEngine`] (every op, run in worker threads
//! by aio-core's blocking implementation: `preadv2` / `pwritev2` with FUA or NOWAIT, guest
//! memory, `fsync` / `fdatasync`, discard and write-zeroes) and a general offload for any
//! blocking closure whose result comes back in the loop ([`PoolContext::run`], QEMU's
//! "threadlets"; handing work to a thread pool has a fixed cost, which `benches/pool.rs`
//! measures).
//!
//! * **Threads** ([`PoolConfig`], QEMU's defaults): at most 64, at least 0, a thread above the
//!   minimum exits after 10 s without work; all settable, also at run time
//!   ([`ThreadPool::set_config`]). A thread is spawned when work is queued that no idle,
//!   spinning or just-spawned thread will take and fewer than the maximum run. A thread counts
//!   as idle only while it waits for work (QEMU's thread-pool idle-thread accounting: counting
//!   busy threads as idle starves the pool).
//! * **Completions** are signalled through a [`Notifier`] (written once per batch of
//!   completions, not once per completion) plus a syscall-free `has_completions` check that
//!   adaptive polling uses (QEMU's thread-pool notifier/io_poll change: QD1 69.87 -> 49.45 µs).
//! * **Cancel** removes work that no thread has started; it completes with `ECANCELED`.
//! * **A panic** on a worker, in offloaded work or in the I/O path, completes that request with
//!   an error (`ErrorKind::Other`); the thread goes on and no request is lost.
//! * **Shutdown** ([`ThreadPool::shutdown`], or drop) cancels queued work, lets running work
//!   finish, joins every thread, and only then frees buffers.
//!
//! ```
//! use aio_backend_poll::PollLoop;
//! use aio_loop::AioContext;
//! use aio_pool::{PoolConfig, PoolContext, ThreadPool};
//! use std::cell::Cell;
//! use std::rc::Rc;
//!
//! let ctx = AioContext::new(PollLoop::new()).unwrap();
//! let pool = ThreadPool::new(PoolConfig::default()).unwrap();
//! let pool = PoolContext::attach(&ctx, pool, |_ctx, _completion| {}).unwrap();
//! let answer = Rc::new(Cell::new(0));
//! let a = answer.clone();
//! pool.run(|| 6 * 7, move |_ctx, v| a.set(v.unwrap())).unwrap();
//! while answer.get() == 0 {
//!     ctx.poll(true);
//! }
//! assert_eq!(answer.get(), 42);
//! ```
//!
//! [`IoEngine`]: aio_core::engine::IoEngine
//! [`Notifier`]: aio_core::Notifier

// No unsafe code: the workers' syscalls are aio-core's `run_blocking`.
#![forbid(unsafe_code)]

// The module map: `config` (limits, errors, stats), `state` (the shared state and the idle
// accounting), `engine` (`ThreadPool`: submit, collect, cancel, shutdown), `worker` (the
// threads and their syscalls), `offload` (`PoolContext`: the pool attached to a loop).
mod config;
mod engine;
#[cfg(all(test, aio_loom))]
mod loom_model;
mod offload;
mod state;
mod worker;

pub use config::{PoolConfig, PoolError, PoolStats};
pub use engine::ThreadPool;
pub use offload::{PoolContext, WORK_TOKEN_BIT};
pub(crate) use state::{Job, Shared, State};
