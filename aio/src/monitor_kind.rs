//! The fd monitors by name: [`MonitorKind`] and `auto`'s order.
//!
//! This module owns the mapping from names to monitors and which ones this build has
//! (features `poll`, `epoll`, `uring`). It constructs monitors only; it never runs a loop.
//! A monitor on the io_uring engine's own ring is a pairing of the two, built by
//! [`Backends::build`](crate::Backends::build).

use std::fmt;
use std::str::FromStr;

use aio_core::EventLoop;

use crate::pick::{pick, Picked};
use crate::{BuildError, UnknownBackend};

/// An fd monitor aio-rs offers, whether or not this build has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MonitorKind {
    /// `ppoll(2)` (`aio-backend-poll`); feature `poll`.
    Poll,
    /// `epoll(7)` (`aio-backend-epoll`); feature `epoll`.
    Epoll,
    /// ppoll below 64 registered fds, epoll from 64 up ([`Hybrid`](crate::Hybrid), QEMU's
    /// choice); features `poll` and `epoll`.
    Hybrid,
    /// io_uring `POLL_ADD` on a ring of its own (`aio-backend-uring`); feature `uring`.
    Uring,
}

impl MonitorKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [MonitorKind; 4] = [
        MonitorKind::Poll,
        MonitorKind::Epoll,
        MonitorKind::Hybrid,
        MonitorKind::Uring,
    ];

    /// The order `auto` tries monitors in: io_uring, hybrid, ppoll.
    pub const AUTO_ORDER: [MonitorKind; 3] =
        [MonitorKind::Uring, MonitorKind::Hybrid, MonitorKind::Poll];

    /// The name on command lines and in reports: `poll`, `epoll`, `hybrid`, `uring`.
    pub fn name(self) -> &'static str {
        match self {
            MonitorKind::Poll => "poll",
            MonitorKind::Epoll => "epoll",
            MonitorKind::Hybrid => "hybrid",
            MonitorKind::Uring => "uring",
        }
    }

    /// The Cargo feature (or features) of the `aio` crate that build this kind.
    pub fn feature(self) -> &'static str {
        match self {
            MonitorKind::Hybrid => "poll` and `epoll",
            other => other.name(),
        }
    }

    /// Whether this build has the kind (its features are on); the kernel may still refuse it.
    pub fn in_build(self) -> bool {
        match self {
            MonitorKind::Poll => cfg!(feature = "poll"),
            MonitorKind::Epoll => cfg!(feature = "epoll"),
            MonitorKind::Hybrid => cfg!(all(feature = "poll", feature = "epoll")),
            MonitorKind::Uring => cfg!(feature = "uring"),
        }
    }

    /// Every kind this build and kernel can build, in report order.
    pub fn available() -> Vec<MonitorKind> {
        MonitorKind::ALL
            .into_iter()
            .filter(|k| k.build().is_ok())
            .collect()
    }

    /// Builds the monitor, or says why this build or kernel cannot.
    pub fn build(self) -> Result<Box<dyn EventLoop>, BuildError> {
        match self {
            #[cfg(feature = "poll")]
            MonitorKind::Poll => Ok(Box::new(aio_backend_poll::PollLoop::new())),
            #[cfg(feature = "epoll")]
            MonitorKind::Epoll => Ok(Box::new(
                aio_backend_epoll::EpollLoop::new()
                    .map_err(BuildError::refused("fd monitor", self.name()))?,
            )),
            #[cfg(all(feature = "poll", feature = "epoll"))]
            MonitorKind::Hybrid => Ok(Box::new(crate::Hybrid::new(
                aio_backend_poll::PollLoop::new(),
                aio_backend_epoll::EpollLoop::new()
                    .map_err(BuildError::refused("fd monitor", self.name()))?,
            ))),
            #[cfg(feature = "uring")]
            MonitorKind::Uring => Ok(Box::new(
                aio_backend_uring::UringLoop::new()
                    .map_err(BuildError::refused("fd monitor", self.name()))?,
            )),
            #[allow(unreachable_patterns)]
            other => Err(BuildError::NotInBuild {
                what: "fd monitor",
                name: other.name(),
                feature: other.feature(),
            }),
        }
    }

    /// The monitor `auto` picks: the first of [`AUTO_ORDER`](Self::AUTO_ORDER) that this
    /// build and kernel build, kept, with a report per candidate tried.
    pub fn auto() -> Result<Picked<MonitorKind, Box<dyn EventLoop>>, BuildError> {
        pick(
            MonitorKind::AUTO_ORDER,
            MonitorKind::name,
            MonitorKind::build,
        )
    }
}

impl fmt::Display for MonitorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MonitorKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MonitorKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownBackend {
                what: "fd monitor",
                name: s.to_string(),
                expected: "poll, epoll, hybrid, uring",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for k in MonitorKind::ALL {
            assert_eq!(k.name().parse::<MonitorKind>().unwrap(), k);
            match k.build() {
                Ok(built) => assert_eq!(built.name(), k.name()),
                Err(BuildError::NotInBuild { .. }) => assert!(!k.in_build()),
                // Where the kernel refuses a kind (io_uring switched off), it says why.
                Err(e) => aio_conformance::skip(&format!("{k}: {e}")),
            }
        }
        let e = "kqueue".parse::<MonitorKind>().unwrap_err();
        assert!(e.to_string().contains("kqueue"), "{e}");
    }

    #[test]
    fn auto_keeps_what_it_built_and_says_why() {
        match MonitorKind::auto() {
            Ok(picked) => {
                assert_eq!(picked.built.name(), picked.kind.name());
                let last = picked.reports.last().expect("a report per candidate");
                assert_eq!(last.to_string(), format!("{}: usable, picked", picked.kind));
            }
            Err(e) => assert!(MonitorKind::AUTO_ORDER.iter().all(|k| !k.in_build()), "{e}"),
        }
    }
}
