//! A backend name this crate does not know: [`UnknownBackend`].
//!
//! This module owns the error of parsing a name; it is a leaf, which the kinds
//! ([`EngineKind`](crate::EngineKind), [`MonitorKind`](crate::MonitorKind)) and the pairings
//! name, and it names none of them.

use std::io;

/// A backend name this crate does not know (whether or not its feature is on, every name is
/// known; see [`BuildError::NotInBuild`](crate::BuildError::NotInBuild)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{name}' (expected one of: {expected})")]
pub struct UnknownBackend {
    /// `"engine"` or `"fd monitor"`.
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The names that would have been accepted.
    pub expected: &'static str,
}

aio_core::kit::io_error_from!(UnknownBackend, |_| io::ErrorKind::InvalidInput);
