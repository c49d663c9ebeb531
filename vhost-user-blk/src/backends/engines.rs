//! Building an I/O engine by name, as `--engine` takes it (the daemon's, `aio-bench`'s).
//!
//! This module owns the mapping from names to engines and which ones this build has (Cargo
//! features `pool`, `linux-aio`, `uring`), and the pairing of an engine with the thread pool
//! for the discards and write-zeroes it cannot run. It constructs engines only; it never
//! submits I/O.

use std::fmt;
use std::io;
use std::str::FromStr;

use aio_core::engine::IoEngine;

/// The names of io_uring's task-work modes (`UringConfig::task_run`), as job files write them
/// (`uring_taskrun=`): `auto` (the default), `signal`, `coop`, `defer`.
pub const URING_TASK_RUN_MODES: [&str; 4] = ["auto", "signal", "coop", "defer"];

/// The io_uring engine's options: the registrations, as fio's io_uring engine names them
/// (`registerfiles`, `fixedbufs`), and the task-work mode. Other engines have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringOptions {
    /// Register each file with the ring (`UringConfig::register_files`).
    pub register_files: bool,
    /// Registered-buffer slots (`UringConfig::fixed_buffers`; 0: off).
    pub fixed_buffers: u32,
    /// The task-work mode, one of [`URING_TASK_RUN_MODES`] (`UringConfig::task_run`).
    pub task_run: &'static str,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            register_files: false,
            fixed_buffers: 0,
            task_run: URING_TASK_RUN_MODES[0],
        }
    }
}

impl UringOptions {
    /// Whether any option differs from the default.
    pub fn any(self) -> bool {
        self != UringOptions::default()
    }

    /// The io_uring engine's configuration with these options.
    #[cfg(feature = "uring")]
    pub fn config(self) -> aio_backend_uring::UringConfig {
        aio_backend_uring::UringConfig::default()
            .with_register_files(self.register_files)
            .with_fixed_buffers(self.fixed_buffers)
            .with_task_run(aio_backend_uring::TaskRun::from_name(self.task_run).unwrap_or_default())
    }

    /// Refuses options that are on for an engine other than io_uring, saying which.
    pub fn check_for(self, engine: EngineKind) -> Result<(), String> {
        if self.any() && engine != EngineKind::Uring {
            return Err(format!(
                "registerfiles, fixedbufs and uring_taskrun are io_uring options; this engine is {}",
                engine.fio_ioengine()
            ));
        }
        Ok(())
    }
}

/// An I/O engine this project offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// The thread pool (aio-pool, QEMU's aio=threads).
    Pool,
    /// Linux native AIO (aio-backend-linux-aio, QEMU's aio=native).
    LinuxAio,
    /// io_uring (aio-backend-uring, QEMU's aio=io_uring).
    Uring,
}

impl EngineKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [EngineKind; 3] = [EngineKind::Pool, EngineKind::LinuxAio, EngineKind::Uring];

    /// The fio `ioengine` that runs the same kind of I/O.
    pub fn fio_ioengine(self) -> &'static str {
        match self {
            EngineKind::Pool => "psync",
            EngineKind::LinuxAio => "libaio",
            EngineKind::Uring => "io_uring",
        }
    }

    /// Every kind this build and kernel can build, in report order.
    pub fn available() -> Vec<EngineKind> {
        EngineKind::ALL
            .into_iter()
            .filter(|k| k.build().is_ok())
            .collect()
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Pool => "pool",
            EngineKind::LinuxAio => "linux-aio",
            EngineKind::Uring => "uring",
        }
    }

    /// Builds the engine with its defaults, or says why this build cannot.
    pub fn build(self) -> io::Result<Box<dyn IoEngine>> {
        self.build_with(UringOptions::default())
    }

    /// Builds the engine; `uring` applies to the io_uring engine only (others refuse options
    /// that are on, with an error naming them).
    pub fn build_with(self, uring: UringOptions) -> io::Result<Box<dyn IoEngine>> {
        uring
            .check_for(self)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        match self {
            #[cfg(feature = "pool")]
            EngineKind::Pool => Ok(Box::new(aio_pool::ThreadPool::new(
                aio_pool::PoolConfig::default(),
            )?)),
            #[cfg(feature = "linux-aio")]
            EngineKind::LinuxAio => Ok(Box::new(aio_backend_linux_aio::LinuxAio::new(
                aio_backend_linux_aio::LinuxAioConfig::default(),
            )?)),
            #[cfg(feature = "uring")]
            EngineKind::Uring => Ok(Box::new(aio_backend_uring::UringEngine::new(
                uring.config(),
            )?)),
            #[allow(unreachable_patterns)]
            other => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("engine '{other}' is not in this build (enable its Cargo feature)"),
            )),
        }
    }

    /// As [`build_with`](Self::build_with); with `range_ops` (a job that discards or
    /// writes zeroes), Linux AIO and io_uring come behind [`WithFallback`] with a thread pool, which
    /// takes the ops they refuse as unsupported (Linux AIO: every discard and write-zeroes,
    /// the kernel's AIO has no `fallocate`; io_uring: a block device's), as QEMU sends them to
    /// its thread pool even with `aio=native`. The pool runs every op itself. Without the
    /// `pool` feature the engine is returned alone and refuses those ops.
    ///
    /// [`WithFallback`]: aio_core::engine::WithFallback
    pub fn build_for(self, uring: UringOptions, range_ops: bool) -> io::Result<Box<dyn IoEngine>> {
        let engine = self.build_with(uring)?;
        if !range_ops || self == EngineKind::Pool {
            return Ok(engine);
        }
        #[cfg(feature = "pool")]
        {
            let pool = aio_pool::ThreadPool::new(aio_pool::PoolConfig::default())?;
            Ok(Box::new(aio_core::engine::WithFallback::new(engine, pool)))
        }
        #[cfg(not(feature = "pool"))]
        Ok(engine)
    }
}

/// The order `auto` tries engines in: io_uring, Linux AIO, the thread pool.
pub const AUTO_ORDER: [EngineKind; 3] = [EngineKind::Uring, EngineKind::LinuxAio, EngineKind::Pool];

/// The engine `auto` picks: the first of uring, linux-aio, pool that this build and kernel can
/// build, with one line per candidate saying why it was taken or passed over.
pub fn auto() -> io::Result<(EngineKind, Vec<String>)> {
    crate::backends::monitors::pick(AUTO_ORDER.map(|k| (k, k.name())), |k| k.build().map(drop))
        .map(|(kind, (), why)| (kind, why))
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown engine name.
#[derive(Debug, thiserror::Error)]
#[error("unknown engine '{0}' (expected one of: pool, linux-aio, uring)")]
pub struct UnknownEngine(pub String);

impl FromStr for EngineKind {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownEngine(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "uring")]
    fn every_task_run_name_is_one_the_uring_crate_knows() {
        for name in URING_TASK_RUN_MODES {
            let mode = aio_backend_uring::TaskRun::from_name(name).expect(name);
            assert_eq!(mode.name(), name);
        }
        let opts = UringOptions {
            task_run: "signal",
            ..UringOptions::default()
        };
        assert!(opts.check_for(EngineKind::LinuxAio).is_err());
        assert!(opts.check_for(EngineKind::Uring).is_ok());
    }

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>().unwrap(), k);
            // Where the kernel refuses a kind (io_uring switched off), it says why.
            match k.build() {
                Ok(built) => assert_eq!(built.name(), k.name()),
                Err(e) => aio_core::testing::skip(&format!("{}: {e}", k.name())),
            }
        }
        let (k, why) = auto().unwrap();
        assert_eq!(why.last().unwrap(), &format!("{k}: usable, picked"));
        assert!("spdk"
            .parse::<EngineKind>()
            .unwrap_err()
            .to_string()
            .contains("spdk"));
    }
}
