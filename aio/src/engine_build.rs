//! Building an I/O engine by kind: [`EngineOptions`], [`EngineKind::build`] and `auto`.
//!
//! This module owns the construction of each kind of engine this build has, with its own
//! configuration, and the pairing of an engine with a thread pool for the discards and
//! write-zeroes it refuses. It constructs engines only; it never submits I/O. The names are
//! `engine_kind.rs`'s.

use aio_core::IoEngine;

use crate::pick::{pick, Picked};
use crate::{BuildError, EngineKind};

/// What an engine is built with: each engine's own configuration (present when its feature
/// is on), and whether a thread pool stands behind it.
///
/// ```
/// let options = aio::EngineOptions::default().with_fallback_pool(true);
/// assert!(options.fallback_pool());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineOptions {
    /// The io_uring engine's configuration (registrations, task-work mode, ring size).
    #[cfg(feature = "uring")]
    pub uring: aio_backend_uring::UringConfig,
    /// The Linux AIO engine's configuration.
    #[cfg(feature = "linux-aio")]
    pub linux_aio: aio_backend_linux_aio::LinuxAioConfig,
    /// The thread pool's configuration (as the engine, and as the fallback).
    #[cfg(feature = "pool")]
    pub pool: aio_pool::PoolConfig,
    fallback_pool: bool,
}

impl EngineOptions {
    /// With a thread pool behind Linux AIO and io_uring
    /// ([`WithFallback`](aio_core::engine::WithFallback)) that takes the ops they refuse as
    /// unsupported (Linux AIO: every discard and write-zeroes, the kernel's AIO has no
    /// `fallocate`; io_uring: a block device's), as QEMU sends them to its thread pool even
    /// with `aio=native`. The pool engine runs every op itself. Without the `pool` feature the
    /// engine is built alone and refuses those ops.
    pub fn with_fallback_pool(mut self, on: bool) -> Self {
        self.fallback_pool = on;
        self
    }

    /// Whether a thread pool stands behind the engine ([`with_fallback_pool`](Self::with_fallback_pool)).
    pub fn fallback_pool(&self) -> bool {
        self.fallback_pool
    }

    /// With the io_uring engine's configuration.
    #[cfg(feature = "uring")]
    pub fn with_uring(mut self, config: aio_backend_uring::UringConfig) -> Self {
        self.uring = config;
        self
    }

    /// With the Linux AIO engine's configuration.
    #[cfg(feature = "linux-aio")]
    pub fn with_linux_aio(mut self, config: aio_backend_linux_aio::LinuxAioConfig) -> Self {
        self.linux_aio = config;
        self
    }

    /// With the thread pool's configuration.
    #[cfg(feature = "pool")]
    pub fn with_pool(mut self, config: aio_pool::PoolConfig) -> Self {
        self.pool = config;
        self
    }

    /// `engine` with the fallback pool behind it if asked for (and not the pool itself).
    pub(crate) fn behind(
        &self,
        kind: EngineKind,
        engine: Box<dyn IoEngine>,
    ) -> Result<Box<dyn IoEngine>, BuildError> {
        if !self.fallback_pool || kind == EngineKind::Pool {
            return Ok(engine);
        }
        #[cfg(feature = "pool")]
        {
            let pool = aio_pool::ThreadPool::new(self.pool)
                .map_err(BuildError::refused("engine", "pool"))?;
            Ok(Box::new(aio_core::engine::WithFallback::new(engine, pool)))
        }
        #[cfg(not(feature = "pool"))]
        Ok(engine)
    }
}

impl EngineKind {
    /// Every kind this build and kernel can build with the default options, in report order.
    pub fn available() -> Vec<EngineKind> {
        let options = EngineOptions::default();
        EngineKind::ALL
            .into_iter()
            .filter(|k| k.build(&options).is_ok())
            .collect()
    }

    /// Builds the engine with `options` (its own configuration, and the fallback pool if
    /// asked for), or says why this build or kernel cannot.
    pub fn build(self, options: &EngineOptions) -> Result<Box<dyn IoEngine>, BuildError> {
        let engine = self.build_alone(options)?;
        options.behind(self, engine)
    }

    /// The engine alone, without a fallback pool.
    #[cfg_attr(
        not(any(feature = "pool", feature = "linux-aio", feature = "uring")),
        allow(unused_variables)
    )]
    fn build_alone(self, options: &EngineOptions) -> Result<Box<dyn IoEngine>, BuildError> {
        match self {
            #[cfg(feature = "pool")]
            EngineKind::Pool => Ok(Box::new(
                aio_pool::ThreadPool::new(options.pool)
                    .map_err(BuildError::refused("engine", self.name()))?,
            )),
            #[cfg(feature = "linux-aio")]
            EngineKind::LinuxAio => Ok(Box::new(
                aio_backend_linux_aio::LinuxAio::new(options.linux_aio)
                    .map_err(BuildError::refused("engine", self.name()))?,
            )),
            #[cfg(feature = "uring")]
            EngineKind::Uring => Ok(Box::new(
                aio_backend_uring::UringEngine::new(options.uring)
                    .map_err(BuildError::refused("engine", self.name()))?,
            )),
            #[allow(unreachable_patterns)]
            other => Err(BuildError::NotInBuild {
                what: "engine",
                name: other.name(),
                feature: other.feature(),
            }),
        }
    }

    /// The engine `auto` picks: the first of [`AUTO_ORDER`](Self::AUTO_ORDER) that this build
    /// and kernel build with `options`, kept (never built twice, so a limit shared with other
    /// processes cannot be taken between a probe and the real build), with a report per
    /// candidate tried.
    pub fn auto(
        options: &EngineOptions,
    ) -> Result<Picked<EngineKind, Box<dyn IoEngine>>, BuildError> {
        pick(EngineKind::AUTO_ORDER, EngineKind::name, |k| {
            k.build(options)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for k in EngineKind::ALL {
            assert_eq!(k.name().parse::<EngineKind>().unwrap(), k);
            match k.build(&EngineOptions::default()) {
                Ok(built) => assert_eq!(built.name(), k.name()),
                Err(BuildError::NotInBuild { feature, .. }) => {
                    assert!(!k.in_build());
                    assert_eq!(feature, k.feature());
                }
                // Where the kernel refuses a kind (io_uring switched off), it says why.
                Err(e) => aio_conformance::skip(&format!("{k}: {e}")),
            }
        }
        let e = "spdk".parse::<EngineKind>().unwrap_err();
        assert!(e.to_string().contains("spdk"), "{e}");
        assert_eq!(
            std::io::Error::from(e).kind(),
            std::io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn auto_keeps_what_it_built_and_says_why() {
        match EngineKind::auto(&EngineOptions::default()) {
            Ok(picked) => {
                assert_eq!(picked.built.name(), picked.kind.name());
                let last = picked.reports.last().expect("a report per candidate");
                assert_eq!(last.to_string(), format!("{}: usable, picked", picked.kind));
            }
            Err(e) => {
                // No engine in this build at all: every candidate says so.
                assert!(EngineKind::ALL.iter().all(|k| !k.in_build()), "{e}");
            }
        }
    }

    #[test]
    #[cfg(all(feature = "linux-aio", feature = "pool"))]
    fn a_fallback_pool_stands_behind_linux_aio_only_when_asked() {
        let plain = EngineKind::LinuxAio.build(&EngineOptions::default());
        let behind = EngineKind::LinuxAio.build(&EngineOptions::default().with_fallback_pool(true));
        match (plain, behind) {
            (Ok(plain), Ok(behind)) => {
                // The pair answers with the primary's name and waits on both engines'
                // notifiers.
                assert_eq!(plain.name(), "linux-aio");
                assert_eq!(behind.name(), "linux-aio");
                assert_eq!(plain.notifiers().len(), 1);
                assert_eq!(behind.notifiers().len(), 2);
            }
            (Err(e), _) | (_, Err(e)) => aio_conformance::skip(&format!("linux-aio: {e}")),
        }
    }
}
