//! # aio
//!
//! aio-rs in one crate: the contracts and the event loop of [`aio_core`] (every item of its
//! root, and its modules, are reachable from here), the backends a build asks for by Cargo
//! feature, and the backends built by name, as a command line or a configuration file names
//! them.
//!
//! | feature | backend | re-exported as |
//! | --- | --- | --- |
//! | `poll` | fd monitor on `ppoll(2)` | `poll` (`aio-backend-poll`) |
//! | `epoll` | fd monitor on `epoll(7)` | `epoll` (`aio-backend-epoll`) |
//! | `linux-aio` | engine on Linux native AIO (QEMU's `aio=native`) | `linux_aio` |
//! | `pool` | engine on a thread pool (QEMU's `aio=threads`), and work offload | `pool` |
//! | `uring` | io_uring: an engine, an fd monitor, or both on one ring | `uring` |
//! | `all` | every backend | |
//! | `testing` | aio-core's conformance suites and `FakeClock` | `testing` |
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
mod engine_kind;
mod error;
mod monitor_kind;
mod pairing;
mod probe;

pub use aio_core::*;

pub use choice::{Choice, Picked};
pub use engine_kind::{EngineKind, EngineOptions};
pub use error::{BuildError, UnknownBackend};
pub use monitor_kind::MonitorKind;
pub use pairing::{Backends, Pairing};
pub use probe::{probe, Probe};

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
