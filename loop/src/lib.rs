//! # aio-loop
//!
//! The event loop of aio-rs, a Rust rebuild of QEMU's `AioContext`, over the contracts of
//! `aio-core` (an [`EventLoop`](aio_core::EventLoop) monitor, [`IoEngine`](aio_core::IoEngine)
//! engines). Backends do not depend on this crate; the facade `aio` re-exports it.
//!
//! * [`AioContext`]: the loop over any monitor: fd handlers with `io_read` / `io_write` /
//!   `io_poll` / `io_poll_ready`, bottom halves schedulable from any thread, nanosecond timers,
//!   `notify()` with QEMU's notify_me optimisation, adaptive busy polling with a per-handler
//!   idle poll set ([`PollParams`], [`PollRule`]), nested `poll()`, and [`LoopCounters`].
//! * [`AttachedEngine`]: an engine attached to a context with [`AioContext::attach_engine`]:
//!   completions delivered in the loop, to one callback or to each request's own
//!   ([`AttachedEngine::submit_with`]).
//! * [`task`]: async/await on the loop: [`AioContext::spawn`] and [`AioContext::block_on`]
//!   (no extra thread, `Send + Sync` wakers through a bottom half), engine futures on
//!   [`AttachedEngine`] (`read`, `write`, ... with the buffers handed back; dropping one
//!   cancels its request without freeing memory early), [`task::sleep`], [`task::timeout`],
//!   [`task::readable`], [`task::join_all`].
//! * [`IoThread`]: QEMU's IOThread object: a named thread that builds its context and state on
//!   itself and serves closures, bottom halves, poll parameters and counters to any thread
//!   through a `Send + Sync + Clone` [`IoThreadHandle`].
//! * [`Clock`], [`MonotonicClock`] and [`FakeClock`]: the loop's nanosecond time, real or
//!   driven by a test.
//!
//! ```no_run
//! use aio_core::EventLoop;
//! use aio_loop::{AioContext, FdHandler};
//! # fn demo<L: EventLoop>(monitor: L, fd: std::os::unix::net::UnixStream) -> Result<(), aio_core::AioError> {
//! let ctx = AioContext::new(monitor)?;
//! ctx.set_fd_handler(&fd, FdHandler::new().on_read(|ctx: &AioContext<L>| {
//!     // read from fd ...
//!     ctx.bh_schedule_oneshot(|_| println!("deferred work"));
//! }))?;
//! loop {
//!     ctx.poll(true);
//! }
//! # }
//! ```
//!
//! A virtual disk's requests, straight into guest memory and back, with their own callbacks:
//!
//! ```no_run
//! use aio_core::engine::{IoEngine, IoFile, LentMemory, Request, RwFlags};
//! use aio_core::EventLoop;
//! use aio_loop::AttachedEngine;
//! # fn demo<L: EventLoop + 'static, E: IoEngine + 'static>(
//! #     engine: &AttachedEngine<L, E>, disk: &IoFile, guest_ram: *mut u8,
//! # ) -> Result<(), aio_core::engine::SubmitError> {
//! // SAFETY: these 4 KiB of guest RAM stay mapped, and the guest does not touch them, until
//! // the completion hands the memory back.
//! let mem = unsafe { LentMemory::new([(guest_ram, 4096)], None) };
//! let disk2 = disk.clone();
//! engine.submit_with(Request::read_guest(disk, 0, mem, 1), move |_ctx, engine, done| {
//!     let _bytes = done.result; // the errno, if any, is this request's
//!     // The callback submits the next request itself: a discard, say.
//!     let _ = engine.submit(Request::discard(&disk2, 1 << 20, 1 << 20, 2));
//! })?;
//! let buf = aio_core::engine::AlignedBuf::from_slice(&[0; 4096]);
//! engine.submit(Request::write(disk, 0, buf, 3).with_flags(RwFlags::FUA))?;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod attached;
mod clock;
mod context;
mod iothread;
mod polling;
mod sync;
pub mod task;

pub use attached::{AttachedEngine, RequestId, PER_REQUEST_TOKEN_BIT};
pub use clock::{Clock, FakeClock, MonotonicClock};
pub use context::handlers::FdHandler;
pub use context::{
    AioContext, BottomHalf, DeferSection, DeferredCall, LoopCounters, NotifyHandle, TimerId,
    IDLE_BH_DELAY_NS,
};
pub use iothread::{IoThread, IoThreadError, IoThreadHandle};
pub use polling::{
    BadPollMaxNs, PollMaxNs, PollParams, PollRule, AUTO_MAX_NS, DEFAULT_POLL_IDLE_NS,
    DEFAULT_POLL_MAX_NS, POLL_START_NS,
};
