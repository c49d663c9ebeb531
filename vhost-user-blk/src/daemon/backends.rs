//! The engine and the fd monitor the daemon runs, by the names [`crate::backends`] gives them.
//!
//! This module owns the daemon's choices only: which names `--engine` and `--fdmon` offer
//! (every backend this build has, and `auto`), and that an engine comes with a thread pool
//! behind it for the discards and write-zeroes it refuses, as QEMU sends them to its thread
//! pool with `aio=native`.

use std::io;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;

use crate::backends::engines::{self, EngineKind, UringOptions};
use crate::backends::monitors::{self, MonitorKind};

/// The engine names `--engine` takes: every [`EngineKind`], and `auto`.
pub fn engine_names() -> Vec<&'static str> {
    EngineKind::ALL
        .into_iter()
        .map(EngineKind::name)
        .chain(["auto"])
        .collect()
}

/// The fd monitor names `--fdmon` takes: every [`MonitorKind`] but the shared ring (the
/// daemon's engines and monitor are built apart), and `auto`.
pub fn monitor_names() -> Vec<&'static str> {
    MonitorKind::ALL
        .into_iter()
        .filter(|&k| k != MonitorKind::SharedRing)
        .map(MonitorKind::name)
        .chain(["auto"])
        .collect()
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// The engine `name` (one of [`engine_names`]; `auto` takes the first of uring, linux-aio, pool
/// this build and kernel can build), with a thread pool behind it for the ops it refuses.
/// Returns the name built.
pub fn build_engine(name: &str) -> io::Result<(Box<dyn IoEngine>, &'static str)> {
    let kind = match name {
        "auto" => engines::auto()?.0,
        other => other.parse::<EngineKind>().map_err(invalid)?,
    };
    Ok((kind.build_for(UringOptions::default(), true)?, kind.name()))
}

/// The fd monitor `name` (one of [`monitor_names`]; `auto` takes the first of uring, hybrid,
/// poll).
pub fn build_monitor(name: &str) -> io::Result<Box<dyn EventLoop>> {
    let kind = match name {
        "auto" => monitors::auto()?.0,
        other => other.parse::<MonitorKind>().map_err(invalid)?,
    };
    kind.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_offered_is_known_and_others_are_refused() {
        for name in engine_names() {
            if let Err(e) = build_engine(name) {
                // Known, and refused for a reason this build or kernel gives.
                assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{name}: {e}");
            }
        }
        for name in monitor_names() {
            if let Err(e) = build_monitor(name) {
                assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{name}: {e}");
            }
        }
        let e = build_engine("spdk").err().expect("unknown");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("spdk"), "{e}");
        assert!(build_monitor("kqueue").is_err());
    }
}
