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

/// The engine `name` (one of [`engine_names`]), with a thread pool behind it for the ops it
/// refuses. Returns the name built.
///
/// `auto` builds the first of uring, linux-aio, pool that builds here, and keeps it: the
/// engine it probes is the engine it returns, so a limit shared with other processes (the
/// locked memory io_uring's rings count against) taken between a probe and a second build
/// cannot fail a daemon that asked for any engine.
pub fn build_engine(name: &str) -> io::Result<(Box<dyn IoEngine>, &'static str)> {
    let build = |kind: EngineKind| kind.build_for(UringOptions::default(), true);
    if name != "auto" {
        let kind = name.parse::<EngineKind>().map_err(invalid)?;
        return Ok((build(kind)?, kind.name()));
    }
    let order = engines::AUTO_ORDER.map(|k| (k, k.name()));
    let (kind, engine, _why) = monitors::pick(order, build)?;
    Ok((engine, kind.name()))
}

/// The fd monitor `name` (one of [`monitor_names`]); `auto` builds the first of uring,
/// hybrid, poll that builds here, and keeps it (as [`build_engine`] does).
pub fn build_monitor(name: &str) -> io::Result<Box<dyn EventLoop>> {
    if name != "auto" {
        return name.parse::<MonitorKind>().map_err(invalid)?.build();
    }
    let order = monitors::AUTO_ORDER.map(|k| (k, k.name()));
    let (_kind, monitor, _why) = monitors::pick(order, MonitorKind::build)?;
    Ok(monitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_offered_is_known_and_others_are_refused() {
        // A name offered is known: it builds, or this build or kernel refuses it (io_uring
        // switched off by `kernel.io_uring_disabled` is EPERM, a small memlock limit ENOMEM),
        // which is a skip, never the unknown name's InvalidInput.
        let refused = |what: &str, name: &str, e: io::Error| {
            assert_ne!(e.kind(), io::ErrorKind::InvalidInput, "{name}: {e}");
            aio_core::testing::skip(&format!("{what} {name}: {e}"));
        };
        for name in engine_names() {
            if let Err(e) = build_engine(name) {
                refused("engine", name, e);
            }
        }
        for name in monitor_names() {
            if let Err(e) = build_monitor(name) {
                refused("fd monitor", name, e);
            }
        }
        let e = build_engine("spdk").err().expect("unknown");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("spdk"), "{e}");
        assert!(build_monitor("kqueue").is_err());
    }
}
