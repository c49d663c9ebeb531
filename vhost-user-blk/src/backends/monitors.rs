//! Building an fd monitor by name, as `--fdmon` takes it (the daemon's, `aio-bench`'s).
//!
//! This module owns the mapping from names to monitors and which ones this build has (Cargo
//! features `poll`, `epoll`, `uring`). It constructs monitors only; it never runs a loop.

use std::fmt;
use std::io;
use std::str::FromStr;

use aio_core::EventLoop;

/// An fd monitor this project offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonitorKind {
    /// `ppoll(2)` (backend-poll).
    Poll,
    /// `epoll(7)` (backend-epoll).
    Epoll,
    /// ppoll below 64 registered fds, epoll from 64 up ([`aio_core::Hybrid`]).
    Hybrid,
    /// io_uring `POLL_ADD` (backend-uring).
    Uring,
    /// io_uring `POLL_ADD` on the ring of the io_uring engine
    /// (`aio_backend_uring::shared_ring`: its completions need no eventfd). Built together
    /// with that engine, by the commands that pair them (`vs-fio`, `peers`); with another
    /// engine those commands give the monitor a ring of its own.
    SharedRing,
}

impl MonitorKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [MonitorKind; 5] = [
        MonitorKind::Poll,
        MonitorKind::Epoll,
        MonitorKind::Hybrid,
        MonitorKind::Uring,
        MonitorKind::SharedRing,
    ];

    /// Every kind this build and kernel can build on its own (not
    /// [`MonitorKind::SharedRing`]), in report order.
    pub fn available() -> Vec<MonitorKind> {
        MonitorKind::ALL
            .into_iter()
            .filter(|k| k.build().is_ok())
            .collect()
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            MonitorKind::Poll => "poll",
            MonitorKind::Epoll => "epoll",
            MonitorKind::Hybrid => "hybrid",
            MonitorKind::Uring => "uring",
            MonitorKind::SharedRing => "shared-ring",
        }
    }

    /// Builds the monitor, or says why this build or kernel cannot. A
    /// [`MonitorKind::SharedRing`] is refused: it is built with its engine.
    pub fn build(self) -> io::Result<Box<dyn EventLoop>> {
        match self {
            MonitorKind::SharedRing => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "fd monitor 'shared-ring' shares the io_uring engine's ring and is built with \
                 that engine (aio_backend_uring::shared_ring: aio-bench's vs-fio and peers)",
            )),
            #[cfg(feature = "poll")]
            MonitorKind::Poll => Ok(Box::new(aio_backend_poll::PollLoop::new())),
            #[cfg(feature = "epoll")]
            MonitorKind::Epoll => Ok(Box::new(aio_backend_epoll::EpollLoop::new()?)),
            #[cfg(all(feature = "poll", feature = "epoll"))]
            MonitorKind::Hybrid => Ok(Box::new(aio_core::Hybrid::new(
                aio_backend_poll::PollLoop::new(),
                aio_backend_epoll::EpollLoop::new()?,
            ))),
            #[cfg(feature = "uring")]
            MonitorKind::Uring => Ok(Box::new(aio_backend_uring::UringLoop::new()?)),
            #[allow(unreachable_patterns)]
            other => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("fd monitor '{other}' is not in this build (enable its Cargo feature)"),
            )),
        }
    }
}

/// The order `auto` tries fd monitors in: io_uring, hybrid (ppoll, then epoll from 64 fds),
/// ppoll.
pub const AUTO_ORDER: [MonitorKind; 3] =
    [MonitorKind::Uring, MonitorKind::Hybrid, MonitorKind::Poll];

/// The fd monitor `auto` picks: the first of uring, hybrid, poll that this build and kernel can
/// build, with one line per candidate saying why it was taken or passed over.
pub fn auto() -> io::Result<(MonitorKind, Vec<String>)> {
    pick(AUTO_ORDER.map(|k| (k, k.name())), |k| k.build().map(drop))
        .map(|(kind, (), why)| (kind, why))
}

/// The first of `order` that `try_build` builds, what it built, and the reasons for each
/// candidate tried: [`aio_core::Ladder`] over this build's backends. A caller that keeps what
/// was built (the daemon's `auto`) never builds twice, so a limit shared with other processes
/// cannot be taken between a probe and the real build.
pub(crate) fn pick<K: Copy, T>(
    order: impl IntoIterator<Item = (K, &'static str)>,
    try_build: impl Fn(K) -> io::Result<T>,
) -> io::Result<(K, T, Vec<String>)> {
    let try_build = &try_build;
    let mut ladder = aio_core::Ladder::new();
    for (k, name) in order {
        ladder = ladder.rung(name, move || try_build(k).map(|built| (k, built)));
    }
    let choice = ladder.climb()?;
    let why = choice.reports.iter().map(ToString::to_string).collect();
    let (kind, built) = choice.value;
    Ok((kind, built, why))
}

impl fmt::Display for MonitorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown monitor name.
#[derive(Debug, thiserror::Error)]
#[error("unknown fd monitor '{0}' (expected one of: poll, epoll, hybrid, uring, shared-ring)")]
pub struct UnknownMonitor(pub String);

impl FromStr for MonitorKind {
    type Err = UnknownMonitor;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MonitorKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownMonitor(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for k in MonitorKind::ALL {
            assert_eq!(k.name().parse::<MonitorKind>().unwrap(), k);
            if k == MonitorKind::SharedRing {
                let e = k.build().err().expect("built with its engine only");
                assert!(e.to_string().contains("shared_ring"), "{e}");
                continue;
            }
            // Where the kernel refuses a kind (io_uring switched off), it says why.
            match k.build() {
                Ok(built) => assert_eq!(built.name(), k.name()),
                Err(e) => aio_core::testing::skip(&format!("{}: {e}", k.name())),
            }
        }
        let (k, why) = auto().unwrap();
        assert_eq!(why.last().unwrap(), &format!("{k}: usable, picked"));
        let e = "kqueue".parse::<MonitorKind>().unwrap_err();
        assert!(e.to_string().contains("kqueue"));
    }
}
