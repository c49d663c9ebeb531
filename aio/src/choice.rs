//! A backend as a user names it: `auto`, or one kind; and what `auto` reports.
//!
//! This module owns the parsing of `auto` and what a [`Choice`] builds; the kinds themselves
//! are [`EngineKind`] and [`MonitorKind`], and the climb down a list of candidates
//! ([`Ladder`](crate::Ladder)) that `auto` builds with is `pick.rs`'s.

use std::fmt;
use std::str::FromStr;

use aio_core::{EventLoop, IoEngine};

use crate::pick::Picked;
use crate::{BuildError, EngineKind, EngineOptions, MonitorKind};

/// A backend named on a command line or in a configuration file: `auto`, or one kind
/// ([`EngineKind`] or [`MonitorKind`]).
///
/// ```
/// use aio::{Choice, EngineKind};
///
/// assert_eq!("auto".parse::<Choice<EngineKind>>()?, Choice::Auto);
/// assert_eq!("uring".parse::<Choice<EngineKind>>()?, Choice::Named(EngineKind::Uring));
/// assert!("spdk".parse::<Choice<EngineKind>>().is_err());
/// # Ok::<(), aio::UnknownBackend>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Choice<K> {
    /// The first candidate this build and kernel can build, in the kind's `AUTO_ORDER`.
    #[default]
    Auto,
    /// This kind, or an error saying why not.
    Named(K),
}

impl<K: FromStr> FromStr for Choice<K> {
    type Err = K::Err;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            Ok(Choice::Auto)
        } else {
            s.parse().map(Choice::Named)
        }
    }
}

impl<K: fmt::Display> fmt::Display for Choice<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Auto => f.write_str("auto"),
            Choice::Named(k) => k.fmt(f),
        }
    }
}

impl Choice<EngineKind> {
    /// Builds the engine chosen, with `options`.
    pub fn build(
        self,
        options: &EngineOptions,
    ) -> Result<Picked<EngineKind, Box<dyn IoEngine>>, BuildError> {
        match self {
            Choice::Auto => EngineKind::auto(options),
            Choice::Named(kind) => Ok(Picked {
                kind,
                built: kind.build(options)?,
                reports: Vec::new(),
            }),
        }
    }
}

impl Choice<MonitorKind> {
    /// Builds the fd monitor chosen.
    pub fn build(self) -> Result<Picked<MonitorKind, Box<dyn EventLoop>>, BuildError> {
        match self {
            Choice::Auto => MonitorKind::auto(),
            Choice::Named(kind) => Ok(Picked {
                kind,
                built: kind.build()?,
                reports: Vec::new(),
            }),
        }
    }
}
