//! # aio
//!
//! aio-rs in one crate: the contracts of [`aio_core`] and the event loop of [`aio_loop`]
//! (re-exported here by name: [`engine`], [`task`], [`AioContext`], [`EventLoop`], ...; the
//! backend authors' kit and the conformance suite stay in their crates), the backends a build
//! asks for by Cargo feature, the backends built by name, as a command line or a configuration
//! file names them, and what picks and combines them: the probe [`Ladder`], the [`Hybrid`]
//! monitor, and the [`process`] helpers (fd limit, CPU pinning, CPU time).
//!
//! | feature | backend | re-exported as |
//! | --- | --- | --- |
//! | `poll` | fd monitor on `ppoll(2)` | `poll` (`aio-backend-poll`) |
//! | `epoll` | fd monitor on `epoll(7)` | `epoll` (`aio-backend-epoll`) |
//! | `linux-aio` | engine on Linux native AIO (QEMU's `aio=native`) | `linux_aio` |
//! | `pool` | engine on a thread pool (QEMU's `aio=threads`), and work offload | `pool` |
//! | `uring` | io_uring: an engine, an fd monitor, or both on one ring | `uring` |
//! | `all` | every backend | |
//!
//! No backend is on by default (as mio's `os-poll`): a crate names the ones it ships, and
//! one whose feature is off is still known by name, and refused with
//! [`BuildError::NotInBuild`] naming the feature.
//!
//! * [`EngineKind`], [`MonitorKind`]: the backends by name, [`FromStr`](std::str::FromStr)
//!   and `Display` as `--engine` and `--fdmon` write them, each built into a boxed
//!   [`IoEngine`] or [`EventLoop`]; engines with their own typed configurations in
//!   [`EngineOptions`].
//! * [`Choice`]: `auto` or one kind; `auto` climbs `AUTO_ORDER` (engines uring, linux-aio,
//!   pool; monitors uring, hybrid, poll), keeps what it built and says why each candidate was
//!   passed over ([`Picked::reports`]).
//! * [`Backends::build`]: a monitor and an engine as a pair, apart or on one shared io_uring
//!   ([`Pairing::SharedRing`]).
//! * [`probe()`]: the report of what this build and kernel offer.
//!
//! ```
//! # #[cfg(all(feature = "epoll", feature = "pool"))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The names come from a configuration file.
//! let (fdmon, engine) = ("epoll", "pool");
//! let backends = aio::Backends::build(
//!     fdmon.parse()?,
//!     engine.parse()?,
//!     &aio::EngineOptions::default(),
//! )?;
//! assert_eq!(backends.engine.kind, aio::EngineKind::Pool);
//! let ctx = aio::AioContext::new(backends.monitor.built)?;
//! let engine = ctx.attach_engine(backends.engine.built, |_ctx, _done| {})?;
//! # drop(engine); Ok(()) }
//! # #[cfg(not(all(feature = "epoll", feature = "pool")))]
//! # fn main() {}
//! ```

#![warn(missing_docs)]

mod choice;
mod engine_build;
mod engine_kind;
mod error;
mod hybrid;
mod ladder;
mod monitor_kind;
mod pairing;
mod pick;
mod probe;
pub mod process;
mod unknown_backend;

// The contracts (aio-core), by name.
pub use aio_core::{
    AioError, Completion, Event, EventLoop, Interest, IoEngine, Notifier, NotifierKind, Token,
};

// The loop (aio-loop), by name.
pub use aio_loop::task;
pub use aio_loop::{
    AioContext, BottomHalf, Clock, DeferSection, DeferredCall, FakeClock, FdHandler, IoThread,
    IoThreadError, IoThreadHandle, LoopCounters, MonotonicClock, NotifyHandle, TimerId,
    IDLE_BH_DELAY_NS,
};
pub use aio_loop::{
    BadPollMaxNs, PollMaxNs, PollParams, PollRule, AUTO_MAX_NS, DEFAULT_POLL_IDLE_NS,
    DEFAULT_POLL_MAX_NS, POLL_START_NS,
};

/// The block I/O contract (`aio-core`'s [`engine`](aio_core::engine) module, whose docs
/// write it out) and the attachment of an engine to a loop (`aio-loop`'s [`AttachedEngine`](aio_loop::AttachedEngine)),
/// in one place as before the split.
pub mod engine {
    #[allow(deprecated)]
    pub use aio_core::engine::GuestIovecs;
    pub use aio_core::engine::{
        AlignedBuf, BufError, Completion, DirectIoAlignment, FileKind, IoBuffers, IoEngine, IoFile,
        LentMemory, MemoryHold, Op, Request, RequestError, ReturnedBuf, RwFlags, SubmitError,
        WithFallback, DEFAULT_ALIGN, DEFAULT_MAX_BATCH, IOV_MAX,
    };
    pub use aio_loop::{AttachedEngine, RequestId, PER_REQUEST_TOKEN_BIT};
}

pub use hybrid::{Hybrid, HybridSide, DEFAULT_HYBRID_THRESHOLD};
pub use ladder::{Ladder, LadderChoice, NoneUsable, RungReport};

pub use choice::Choice;
pub use engine_build::EngineOptions;
pub use engine_kind::EngineKind;
pub use error::BuildError;
pub use monitor_kind::MonitorKind;
pub use pairing::{Backends, Pairing};
pub use pick::Picked;
pub use probe::{probe, Probe};
pub use unknown_backend::UnknownBackend;

/// The `ppoll(2)` fd monitor (feature `poll`).
#[cfg(feature = "poll")]
pub use aio_backend_poll as poll;

/// The `epoll(7)` fd monitor (feature `epoll`).
#[cfg(feature = "epoll")]
pub use aio_backend_epoll as epoll;

/// The Linux native AIO engine (feature `linux-aio`).
#[cfg(feature = "linux-aio")]
pub use aio_backend_linux_aio as linux_aio;

/// The thread pool: an engine and work offload (feature `pool`).
#[cfg(feature = "pool")]
pub use aio_pool as pool;

/// io_uring: an engine, an fd monitor, and both on one ring (feature `uring`).
#[cfg(feature = "uring")]
pub use aio_backend_uring as uring;
