//! The errors of building a backend by name.
//!
//! This module owns what can go wrong between a name and a built backend; it never builds
//! anything itself. A name that names no backend is `unknown_backend.rs`'s
//! [`UnknownBackend`](crate::UnknownBackend).

use std::io;

use crate::EngineKind;

/// Why a backend could not be built. Converts to [`io::Error`] with a kind that says which
/// case it is: `Unsupported` (not in this build), the kernel's own kind (refused here),
/// `InvalidInput` (a pairing that cannot be), `NotFound` (`auto` found none).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The backend's Cargo feature is off in this build.
    #[error(
        "{what} '{name}' is not in this build (turn on the `{feature}` feature of the `aio` crate)"
    )]
    NotInBuild {
        /// `"engine"` or `"fd monitor"`.
        what: &'static str,
        /// The backend's name.
        name: &'static str,
        /// The feature (or features) that would build it.
        feature: &'static str,
    },
    /// The kernel or this process's limits refused it (io_uring switched off by
    /// `kernel.io_uring_disabled`, a locked-memory limit, a missing syscall).
    #[error("{what} '{name}': {source}")]
    Refused {
        /// `"engine"` or `"fd monitor"`.
        what: &'static str,
        /// The backend's name.
        name: &'static str,
        /// The backend's own error, as `io::Error` (its typed error is inside:
        /// [`io::Error::get_ref`]).
        #[source]
        source: io::Error,
    },
    /// The shared ring asked for with an engine other than io_uring's.
    #[error(
        "the shared ring pairs io_uring's fd monitor with io_uring's engine, not with engine '{0}'"
    )]
    SharedRingNeedsUring(EngineKind),
    /// `auto` found no candidate usable; the reports say why for each.
    #[error(transparent)]
    NoneUsable(#[from] crate::NoneUsable),
}

impl BuildError {
    /// The [`io::ErrorKind`] this error converts with.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            BuildError::NotInBuild { .. } => io::ErrorKind::Unsupported,
            BuildError::Refused { source, .. } => source.kind(),
            BuildError::SharedRingNeedsUring(_) => io::ErrorKind::InvalidInput,
            BuildError::NoneUsable(_) => io::ErrorKind::NotFound,
        }
    }

    /// A mapper from a backend's own error to [`BuildError::Refused`].
    #[cfg_attr(
        not(any(
            feature = "epoll",
            feature = "pool",
            feature = "linux-aio",
            feature = "uring"
        )),
        allow(dead_code)
    )]
    pub(crate) fn refused<E: Into<io::Error>>(
        what: &'static str,
        name: &'static str,
    ) -> impl FnOnce(E) -> Self {
        move |e| BuildError::Refused {
            what,
            name,
            source: e.into(),
        }
    }
}

aio_core::kit::io_error_from!(BuildError, BuildError::kind);
