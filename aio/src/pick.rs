//! A backend built by kind: [`Picked`], and the climb down a list of candidates that `auto`
//! builds with.
//!
//! This module owns what a build reports (the kind, the backend, a report per candidate
//! tried) and the climb ([`Ladder`]) over a kind's `AUTO_ORDER`; it never names
//! a kind itself: [`EngineKind`](crate::EngineKind) and [`MonitorKind`](crate::MonitorKind)
//! pass their order, names and constructor in.

use crate::BuildError;
use crate::{Ladder, RungReport};

/// A backend built from a [`Choice`](crate::Choice): which kind, the backend, and for `auto`
/// one report per candidate tried (why each passed over, and the one picked).
#[derive(Debug)]
pub struct Picked<K, T> {
    /// The kind built.
    pub kind: K,
    /// The backend.
    pub built: T,
    /// For `auto`, one report per candidate tried, the picked one last; empty for a
    /// [`Choice::Named`](crate::Choice::Named).
    pub reports: Vec<RungReport>,
}

/// The first of `order` that `try_build` builds, kept, with the reports of each candidate
/// tried.
pub(crate) fn pick<K: Copy, T>(
    order: impl IntoIterator<Item = K>,
    name: fn(K) -> &'static str,
    try_build: impl Fn(K) -> Result<T, BuildError>,
) -> Result<Picked<K, T>, BuildError> {
    let try_build = &try_build;
    let mut ladder = Ladder::new();
    for k in order {
        ladder = ladder.rung(name(k), move || try_build(k).map(|built| (k, built)));
    }
    let choice = ladder.climb()?;
    let (kind, built) = choice.value;
    Ok(Picked {
        kind,
        built,
        reports: choice.reports,
    })
}
