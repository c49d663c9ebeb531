//! The engines a test runs over: every one this build and kernel can build, each with the
//! thread pool behind it for what it refuses (discard, write-zeroes), as the daemon builds
//! them.
//!
//! This module owns the choice of engines; one this machine lacks says `skipped:` why (and
//! fails where `AIO_REQUIRE_ALL_BACKENDS` is set, as in CI).

use aio::{EngineKind, EngineOptions, IoEngine};

/// What the engines are built with: discard and write-zeroes on a thread pool behind Linux
/// AIO, as the daemon builds them.
pub fn options() -> EngineOptions {
    EngineOptions::default().with_fallback_pool(true)
}

/// Every engine, built with [`options`]: one this kernel refuses says `skipped:` why (every
/// kind is compiled in: this crate turns on every engine feature of `aio`).
pub fn engines() -> Vec<(EngineKind, Box<dyn IoEngine>)> {
    EngineKind::ALL
        .into_iter()
        .filter_map(|kind| match kind.build(&options()) {
            Ok(engine) => Some((kind, engine)),
            Err(why) => {
                aio_conformance::skip(&format!("engine {kind}: {why}"));
                None
            }
        })
        .collect()
}

/// The kinds of [`engines`], without keeping the engines.
pub fn engine_kinds() -> Vec<EngineKind> {
    engines().into_iter().map(|(kind, _)| kind).collect()
}
