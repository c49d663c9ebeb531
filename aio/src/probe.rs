//! The probe: which fd monitors and engines this build and kernel offer, why any is
//! unusable, and what `auto` picks and why.
//!
//! This module owns the report; it builds each backend once to find out and drops it.

use std::fmt;

use crate::RungReport;

use crate::{BuildError, EngineKind, EngineOptions, MonitorKind};

/// What [`probe`] found. Its `Display` is the report `aio-bench probe` prints.
#[derive(Debug)]
pub struct Probe {
    /// Each monitor kind, with its description (`EventLoop::describe`) or why it is unusable.
    pub monitors: Vec<(MonitorKind, Result<String, BuildError>)>,
    /// Each engine kind, built with the default options, or why it is unusable.
    pub engines: Vec<(EngineKind, Result<(), BuildError>)>,
    /// What `auto` picks for the monitor, with a report per candidate.
    pub auto_monitor: Result<(MonitorKind, Vec<RungReport>), BuildError>,
    /// What `auto` picks for the engine, with a report per candidate.
    pub auto_engine: Result<(EngineKind, Vec<RungReport>), BuildError>,
}

/// Probes every backend this crate knows, with the default options.
pub fn probe() -> Probe {
    let options = EngineOptions::default();
    Probe {
        monitors: MonitorKind::ALL
            .into_iter()
            .map(|k| (k, k.build().map(|m| m.describe())))
            .collect(),
        engines: EngineKind::ALL
            .into_iter()
            .map(|k| (k, k.build(&options).map(drop)))
            .collect(),
        auto_monitor: MonitorKind::auto().map(|p| (p.kind, p.reports)),
        auto_engine: EngineKind::auto(&options).map(|p| (p.kind, p.reports)),
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fd monitors:")?;
        for (k, found) in &self.monitors {
            match found {
                Ok(describe) => writeln!(f, "  {:<10} ok ({describe})", k.name())?,
                Err(e) => writeln!(f, "  {:<10} unavailable: {e}", k.name())?,
            }
        }
        writeln!(f, "engines:")?;
        for (k, found) in &self.engines {
            match found {
                Ok(()) => writeln!(f, "  {:<10} ok", k.name())?,
                Err(e) => writeln!(f, "  {:<10} unavailable: {e}", k.name())?,
            }
        }
        writeln!(
            f,
            "auto (engines uring -> linux-aio -> pool, fd monitors uring -> hybrid -> poll):"
        )?;
        let auto_monitor = self.auto_monitor.as_ref().map(|(k, r)| (k.name(), r));
        let auto_engine = self.auto_engine.as_ref().map(|(k, r)| (k.name(), r));
        for (what, picked) in [("fd monitor", auto_monitor), ("engine", auto_engine)] {
            match picked {
                Ok((name, reports)) => {
                    writeln!(f, "  {what}: {name}")?;
                    for line in reports {
                        writeln!(f, "    {line}")?;
                    }
                }
                Err(e) => writeln!(f, "  {what}: none: {e}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_report_names_every_backend_and_auto() {
        let report = super::probe().to_string();
        for name in ["poll", "epoll", "hybrid", "pool", "linux-aio", "uring"] {
            assert!(
                report.contains(&format!("  {name:<10} ")),
                "{name}: {report}"
            );
        }
        assert!(report.contains("  engine: "), "{report}");
        assert!(report.contains("  fd monitor: "), "{report}");
    }
}
