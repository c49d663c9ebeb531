//! # aio-core
//!
//! The contracts and the event loop of aio-rs, a Rust rebuild of QEMU's `AioContext`.
//!
//! * [`Notifier`]: a cross-thread wake-up object with a pollable fd (eventfd, pipe fallback).
//! * [`EventLoop`]: the fd-monitor contract a backend implements (`aio-backend-poll`,
//!   `aio-backend-epoll`, `aio-backend-uring`), written out on the trait.
//! * [`AioContext`]: the loop over any monitor: fd handlers with `io_read` / `io_write` /
//!   `io_poll` / `io_poll_ready`, bottom halves schedulable from any thread, nanosecond timers,
//!   `notify()` with QEMU's notify_me optimisation, adaptive busy polling with a per-handler
//!   idle poll set, nested `poll()`, and [`LoopCounters`].
//! * [`Hybrid`]: QEMU's monitor choice as an adapter over two monitors: the small one (ppoll)
//!   below a threshold of registered fds (64), the large one (epoll) from there up.
//! * [`engine`]: the block I/O contract, [`IoEngine`] and
//!   [`Completion`] (read, write, readv, writev, fsync, fdatasync,
//!   discard, write-zeroes on an [`IoFile`](engine::IoFile), FUA and NOWAIT as
//!   [`RwFlags`](engine::RwFlags); buffers owned by the engine while in flight, or guest
//!   memory the caller lends with [`GuestIovecs`](engine::GuestIovecs)), written out in the
//!   module docs; [`WithFallback`](engine::WithFallback) sends what one engine lacks to another;
//!   [`AioContext::attach_engine`] delivers completions in the loop, to one callback or to
//!   each request's own ([`AttachedEngine::submit_with`](engine::AttachedEngine::submit_with)).
//! * [`task`]: async/await on the loop: [`AioContext::spawn`] and [`AioContext::block_on`]
//!   (no extra thread, `Send + Sync` wakers through a bottom half), engine futures on
//!   [`AttachedEngine`](engine::AttachedEngine) (`read`, `write`, ... with the buffers handed back; dropping one
//!   cancels its request without freeing memory early), [`task::sleep`],
//!   [`task::timeout`], [`task::readable`], [`task::join_all`].
//! * [`IoThread`]: QEMU's IOThread object: a named thread that builds its context and state on
//!   itself and serves closures, bottom halves, poll parameters and counters to any thread
//!   through a `Send + Sync + Clone` [`IoThreadHandle`].
//! * `testing` (feature `testing`): the conformance suites every backend runs.
//!
//! ```no_run
//! use aio_core::{AioContext, EventLoop, FdHandler};
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
//! use aio_core::engine::{AttachedEngine, GuestIovecs, IoEngine, IoFile, Request, RwFlags};
//! use aio_core::{AioContext, EventLoop};
//! # fn demo<L: EventLoop + 'static, E: IoEngine + 'static>(
//! #     engine: &AttachedEngine<L, E>, disk: &IoFile, guest_ram: *mut u8,
//! # ) -> Result<(), aio_core::engine::SubmitError> {
//! // SAFETY: these 4 KiB of guest RAM stay mapped, and the guest does not touch them, until
//! // the completion hands the iovecs back.
//! let mem = unsafe { GuestIovecs::from_raw_parts(guest_ram, 4096) };
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

pub mod backend;
mod clock;
mod context;
pub mod engine;
mod error;
mod event_loop;
mod hybrid;
mod iothread;
mod ladder;
mod notifier;
mod polling;
pub mod process;
mod slots;
mod sync;
mod sys;
pub mod task;
#[cfg(feature = "testing")]
pub mod testing;

pub use clock::{Clock, MonotonicClock};
pub use context::{
    AioContext, BottomHalf, DeferSection, DeferredCall, FdHandler, LoopCounters, NotifyHandle,
    TimerId, IDLE_BH_DELAY_NS,
};
pub use engine::{Completion, IoEngine};
pub use error::AioError;
pub use event_loop::{Event, EventLoop, Interest, Token};
pub use hybrid::{Hybrid, HybridSide, DEFAULT_HYBRID_THRESHOLD};
pub use iothread::{IoThread, IoThreadError, IoThreadHandle};
pub use ladder::{Ladder, LadderChoice, NoneUsable, RungReport};
pub use notifier::{Notifier, NotifierKind};
pub use polling::{
    BadPollMaxNs, PollMaxNs, PollParams, PollRule, AUTO_MAX_NS, DEFAULT_POLL_IDLE_NS,
    DEFAULT_POLL_MAX_NS, POLL_START_NS,
};
