//! The command line's value parsers beyond the library types' own `FromStr` (which clap uses
//! for `--engine`, `--fdmon` pairs, `--rw`, `--workloads` and `--device` by itself): `auto`
//! resolved, sizes and durations in fio's units, and the limits a flag adds. A value that does
//! not parse gets the library's message (clap prints it after the flag's name and exits with
//! code 2).
//!
//! This module owns only the adaptation to clap's `Result<T, String>`; what a valid value is
//! belongs to the type's `FromStr` in the library. It never runs anything, except that `auto`
//! runs the probe to resolve itself.

use std::time::Duration;

use aio::{Choice, EngineKind, EngineOptions, MonitorKind, Pairing, UnknownBackend};
use aio_bench::units::{parse_duration, parse_size};

/// An fd monitor on its own (`poll`, `epoll`, `hybrid`, `uring`); `shared-ring` is refused
/// with the commands that pair it.
pub fn parse_monitor(s: &str) -> Result<MonitorKind, String> {
    if s.parse::<Pairing>() == Ok(Pairing::SharedRing) {
        return Err(
            "shared-ring shares the io_uring engine's ring: only vs-fio and peers build the pair"
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

/// A size in fio's units (4k, 64m, 1g).
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A duration in fio's units (500ms, 10s, 1m).
pub fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// A `--runtime`: a duration above zero (a zero measured time would report no measurement,
/// NaN rates).
pub fn parse_runtime_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration_arg(s)?;
    if d.is_zero() {
        return Err(format!("'{s}': the measured time must be more than 0"));
    }
    Ok(d)
}

/// A `--poll-max-ns`: ns (0 turns polling off, at most 1 s) or `auto`.
pub fn parse_poll_max_ns(s: &str) -> Result<aio_core::PollMaxNs, String> {
    match s.parse::<aio_core::PollMaxNs>() {
        Ok(aio_core::PollMaxNs::Fixed(ns)) if ns > 1_000_000_000 => {
            Err(format!("{ns} ns is more than 1 s"))
        }
        Ok(p) => Ok(p),
        Err(e) => Err(e.to_string()),
    }
}
