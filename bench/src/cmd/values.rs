//! The command line's value parsers beyond the library types' own `FromStr` (which clap uses
//! for `--engine`, `--fdmon` pairs, `--rw`, `--workloads` and `--device` by itself) and
//! `aio_bench::units` (sizes, durations and polling limits): the monitors, and `auto`
//! resolved. A value that does not parse gets the library's message (clap prints it after the
//! flag's name and exits with code 2).
//!
//! This module owns only the adaptation to clap's `Result<T, String>`; what a valid value is
//! belongs to the type's `FromStr` in the library. It never runs anything, except that `auto`
//! runs the probe to resolve itself.

use aio::{Choice, EngineKind, EngineOptions, MonitorKind, Pairing, UnknownBackend};

/// An fd monitor on its own (`poll`, `epoll`, `hybrid`, `uring`); `shared-ring` is refused
/// with the commands that pair it.
pub fn parse_monitor(s: &str) -> Result<MonitorKind, String> {
    if s.parse::<Pairing>() == Ok(Pairing::SharedRing) {
        return Err(
            "shared-ring shares the io_uring engine's ring: only vs-fio (and aio-peers) \
             build the pair"
                .to_string(),
        );
    }
    s.parse().map_err(|e: UnknownBackend| e.to_string())
}

/// An fd monitor on its own, or `auto` (resolved now, by the probe order uring -> hybrid ->
/// poll).
pub fn parse_monitor_or_auto(s: &str) -> Result<MonitorKind, String> {
    if s == "auto" {
        return MonitorKind::auto()
            .map(|p| p.kind)
            .map_err(|e| e.to_string());
    }
    parse_monitor(s).map_err(|e| format!("{e}, or auto"))
}

/// An engine name or `auto` (resolved now, by the probe order uring -> linux-aio -> pool).
pub fn parse_engine_or_auto(s: &str) -> Result<EngineKind, String> {
    match s.parse::<Choice<EngineKind>>() {
        Ok(Choice::Auto) => EngineKind::auto(&EngineOptions::default())
            .map(|p| p.kind)
            .map_err(|e| e.to_string()),
        Ok(Choice::Named(kind)) => Ok(kind),
        Err(e) => Err(format!("{e}, or auto")),
    }
}
