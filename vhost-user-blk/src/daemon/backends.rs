//! Building the engine and the fd monitor the daemon runs, by the names `aio-bench` uses.
//!
//! This module owns which backends this build has (Cargo features `poll`, `epoll`, `pool`,
//! `linux-aio`, `uring`) and the `auto` choice through [`aio_core::Ladder`]; it constructs
//! backends only.

use std::io;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;

/// The engine names `--engine` takes.
pub const ENGINES: [&str; 4] = ["uring", "linux-aio", "pool", "auto"];
/// The fd monitor names `--fdmon` takes.
pub const MONITORS: [&str; 5] = ["poll", "epoll", "hybrid", "uring", "auto"];

fn not_built(kind: &str, name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{kind} '{name}' is not in this build (enable its Cargo feature)"),
    )
}

/// The engine `name` (one of [`ENGINES`]), with a thread pool behind it for the discards and
/// write-zeroes it refuses (Linux AIO has no `fallocate`; io_uring refuses a block device's),
/// as QEMU sends them to its thread pool with `aio=native`. Returns the name built.
pub fn build_engine(name: &str) -> io::Result<(Box<dyn IoEngine>, &'static str)> {
    if name == "auto" {
        let mut ladder = aio_core::Ladder::new();
        for candidate in ["uring", "linux-aio", "pool"] {
            ladder = ladder.rung(candidate, move || build_engine(candidate));
        }
        return Ok(ladder.climb()?.value);
    }
    match name {
        #[cfg(feature = "uring")]
        "uring" => Ok((
            with_fallback(Box::new(aio_backend_uring::UringEngine::new(
                aio_backend_uring::UringConfig::default(),
            )?))?,
            "uring",
        )),
        #[cfg(feature = "linux-aio")]
        "linux-aio" => Ok((
            with_fallback(Box::new(aio_backend_linux_aio::LinuxAio::new(
                aio_backend_linux_aio::LinuxAioConfig::default(),
            )?))?,
            "linux-aio",
        )),
        #[cfg(feature = "pool")]
        "pool" => Ok((
            Box::new(aio_pool::ThreadPool::new(aio_pool::PoolConfig::default())?),
            "pool",
        )),
        other if ENGINES.contains(&other) => Err(not_built("engine", other)),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown engine '{other}'"),
        )),
    }
}

/// `engine` with a thread pool behind it for the ops it refuses (without the `pool` feature,
/// alone).
#[allow(dead_code)] // unused in builds without an in-kernel engine
fn with_fallback(engine: Box<dyn IoEngine>) -> io::Result<Box<dyn IoEngine>> {
    #[cfg(feature = "pool")]
    {
        let pool = aio_pool::ThreadPool::new(aio_pool::PoolConfig::default())?;
        Ok(Box::new(aio_core::engine::WithFallback::new(engine, pool)))
    }
    #[cfg(not(feature = "pool"))]
    Ok(engine)
}

/// The fd monitor `name` (one of [`MONITORS`]); `auto` walks uring, hybrid, poll.
pub fn build_monitor(name: &str) -> io::Result<Box<dyn EventLoop>> {
    match name {
        "auto" => {
            let mut ladder = aio_core::Ladder::new();
            for candidate in ["uring", "hybrid", "poll"] {
                ladder = ladder.rung(candidate, move || build_monitor(candidate));
            }
            Ok(ladder.climb()?.value)
        }
        #[cfg(feature = "poll")]
        "poll" => Ok(Box::new(aio_backend_poll::PollLoop::new())),
        #[cfg(feature = "epoll")]
        "epoll" => Ok(Box::new(aio_backend_epoll::EpollLoop::new()?)),
        #[cfg(all(feature = "poll", feature = "epoll"))]
        "hybrid" => Ok(Box::new(aio_core::Hybrid::new(
            aio_backend_poll::PollLoop::new(),
            aio_backend_epoll::EpollLoop::new()?,
        ))),
        #[cfg(feature = "uring")]
        "uring" => Ok(Box::new(aio_backend_uring::UringLoop::new()?)),
        other if MONITORS.contains(&other) => Err(not_built("fd monitor", other)),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown fd monitor '{other}'"),
        )),
    }
}
