//! The backends by name: the I/O engines and fd monitors this build has (Cargo features
//! `poll`, `epoll`, `pool`, `linux-aio`, `uring`), the names the daemon's `--engine` and
//! `--fdmon` and `aio-bench` take, and what `auto` picks.
//!
//! This module owns the names and the construction, in one place for every program of the
//! workspace; it never submits I/O or runs a loop.
//!
//! ```
//! use aio_vhost_user_blk::backends::engines::EngineKind;
//! use aio_vhost_user_blk::backends::monitors::MonitorKind;
//!
//! let monitor: MonitorKind = "epoll".parse()?;
//! let ctx = aio_core::AioContext::new(monitor.build()?)?;
//! // The thread pool (QEMU's aio=threads); `linux-aio` and `uring` would come with one behind
//! // them for the discards and write-zeroes they cannot run.
//! let engine = "pool".parse::<EngineKind>()?.build_for(Default::default(), true)?;
//! assert_eq!(engine.name(), "pool");
//! # drop(ctx);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod engines;
pub mod monitors;
