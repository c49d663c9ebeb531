//! An fd monitor and an engine built as a pair: apart, or on one shared io_uring.
//!
//! This module owns the pairing rule (the shared ring is io_uring's monitor and io_uring's
//! engine on one ring, QEMU's newest design); the kinds build themselves
//! ([`MonitorKind::build`], [`EngineKind::build`]).

use std::fmt;
use std::str::FromStr;

use aio_core::{EventLoop, IoEngine};

use crate::{BuildError, Choice, EngineKind, EngineOptions, MonitorKind, Picked, UnknownBackend};

/// How the fd monitor stands to the engine, as `--fdmon` names it: a monitor of its own
/// (`auto`, `poll`, `epoll`, `hybrid`, `uring`), or `shared-ring`, io_uring's monitor on the
/// io_uring engine's own ring (its completions need no eventfd).
///
/// ```
/// use aio::{Choice, MonitorKind, Pairing};
///
/// assert_eq!("shared-ring".parse::<Pairing>()?, Pairing::SharedRing);
/// assert_eq!("epoll".parse::<Pairing>()?, Pairing::Apart(Choice::Named(MonitorKind::Epoll)));
/// # Ok::<(), aio::UnknownBackend>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pairing {
    /// The monitor on a kernel object of its own.
    Apart(Choice<MonitorKind>),
    /// One io_uring for the monitor and the engine (the engine must be io_uring's).
    SharedRing,
}

impl Default for Pairing {
    fn default() -> Self {
        Pairing::Apart(Choice::Auto)
    }
}

impl FromStr for Pairing {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "shared-ring" {
            return Ok(Pairing::SharedRing);
        }
        s.parse()
            .map(Pairing::Apart)
            .map_err(|e: UnknownBackend| UnknownBackend {
                expected: "auto, poll, epoll, hybrid, uring, shared-ring",
                ..e
            })
    }
}

impl fmt::Display for Pairing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pairing::Apart(choice) => choice.fmt(f),
            Pairing::SharedRing => f.write_str("shared-ring"),
        }
    }
}

/// An fd monitor and an engine, built together by [`Backends::build`]; a context is made
/// over the monitor and the engine attached to it.
///
/// ```no_run
/// # #[cfg(all(feature = "epoll", feature = "linux-aio"))]
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let backends = aio::Backends::build(
///     "epoll".parse()?,
///     "linux-aio".parse()?,
///     &aio::EngineOptions::default(),
/// )?;
/// let ctx = aio::AioContext::new(backends.monitor.built)?;
/// let engine = ctx.attach_engine(backends.engine.built, |_ctx, _done| {})?;
/// # drop(engine); Ok(()) }
/// ```
pub struct Backends {
    /// The fd monitor (for a shared ring, io_uring's on the engine's ring).
    pub monitor: Picked<MonitorKind, Box<dyn EventLoop>>,
    /// The engine, with the fallback pool behind it if the options asked for one.
    pub engine: Picked<EngineKind, Box<dyn IoEngine>>,
    /// Whether the two share one io_uring.
    pub shared_ring: bool,
}

impl fmt::Debug for Backends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backends")
            .field("monitor", &self.monitor.built.describe())
            .field("engine", &self.engine.built.name())
            .field("shared_ring", &self.shared_ring)
            .finish()
    }
}

impl Backends {
    /// Builds the monitor and the engine as `pairing` says. A shared ring needs the io_uring
    /// engine (`auto` is taken to mean it); any other engine is
    /// [`BuildError::SharedRingNeedsUring`].
    pub fn build(
        pairing: Pairing,
        engine: Choice<EngineKind>,
        options: &EngineOptions,
    ) -> Result<Backends, BuildError> {
        match pairing {
            Pairing::Apart(monitor) => Ok(Backends {
                monitor: monitor.build()?,
                engine: engine.build(options)?,
                shared_ring: false,
            }),
            Pairing::SharedRing => match engine {
                Choice::Auto | Choice::Named(EngineKind::Uring) => shared_ring(options),
                Choice::Named(other) => Err(BuildError::SharedRingNeedsUring(other)),
            },
        }
    }
}

#[cfg(feature = "uring")]
fn shared_ring(options: &EngineOptions) -> Result<Backends, BuildError> {
    let (monitor, engine) = aio_backend_uring::shared_ring(options.uring)
        .map_err(BuildError::refused("fd monitor", "shared-ring"))?;
    Ok(Backends {
        monitor: Picked {
            kind: MonitorKind::Uring,
            built: Box::new(monitor),
            reports: Vec::new(),
        },
        engine: Picked {
            kind: EngineKind::Uring,
            built: options.behind(EngineKind::Uring, Box::new(engine))?,
            reports: Vec::new(),
        },
        shared_ring: true,
    })
}

#[cfg(not(feature = "uring"))]
fn shared_ring(_options: &EngineOptions) -> Result<Backends, BuildError> {
    Err(BuildError::NotInBuild {
        what: "fd monitor",
        name: "shared-ring",
        feature: "uring",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_ring_takes_the_uring_engine_only() {
        let options = EngineOptions::default();
        let e = Backends::build(
            Pairing::SharedRing,
            Choice::Named(EngineKind::Pool),
            &options,
        )
        .unwrap_err();
        assert!(
            matches!(e, BuildError::SharedRingNeedsUring(EngineKind::Pool)),
            "{e}"
        );
        assert_eq!(
            std::io::Error::from(e).kind(),
            std::io::ErrorKind::InvalidInput
        );
        match Backends::build(Pairing::SharedRing, Choice::Auto, &options) {
            Ok(pair) => {
                assert!(pair.shared_ring);
                assert_eq!(pair.monitor.built.name(), "uring");
                assert_eq!(pair.engine.built.name(), "uring");
            }
            Err(BuildError::NotInBuild { .. }) => assert!(!EngineKind::Uring.in_build()),
            Err(e) => aio_conformance::skip(&format!("shared ring: {e}")),
        }
    }

    #[test]
    fn pairings_parse_and_print_as_named() {
        for name in ["auto", "poll", "epoll", "hybrid", "uring", "shared-ring"] {
            assert_eq!(name.parse::<Pairing>().unwrap().to_string(), name);
        }
        let e = "kqueue".parse::<Pairing>().unwrap_err();
        assert!(e.to_string().contains("shared-ring"), "{e}");
    }
}
