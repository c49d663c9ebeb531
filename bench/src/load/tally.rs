//! The counts every load generator keeps: the latency histogram's bounds, the [`Tally`] of the
//! requests that finished in the measured window, and the [`Window`] itself (the ramp, then the
//! run).
//!
//! This module owns what is counted and when a request counts; never which requests are
//! issued (the generator's) or how they reach a target (`drive`'s).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// A latency histogram in ns (1 ns to 60 s, 3 significant digits), as every report uses.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// What a load generator counts of the requests that finished in the measured window: how
/// many, their bytes, their latency (issue to completion seen), and failures (when each path
/// counts those is its own: fio counts the ramp's too).
#[derive(Debug, Clone)]
pub struct Tally {
    /// Requests completed.
    pub ios: u64,
    /// Bytes they moved.
    pub bytes: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Their latency, in ns ([`latency_histogram`]).
    pub latency_ns: Histogram<u64>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            ios: 0,
            bytes: 0,
            errors: 0,
            latency_ns: latency_histogram(),
        }
    }
}

impl Tally {
    /// A request issued at `issued` that moved `bytes` and was seen complete at `now`.
    pub fn done(&mut self, bytes: u64, issued: Instant, now: Instant) {
        self.ios += 1;
        self.bytes += bytes;
        let ns = now.saturating_duration_since(issued).as_nanos() as u64;
        self.latency_ns.saturating_record(ns.max(1));
    }

    /// Adds `other`'s requests to these.
    pub fn merge(&mut self, other: &Tally) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.errors += other.errors;
        self.latency_ns
            .add(&other.latency_ns)
            .expect("histograms of the same bounds");
    }
}

/// When a run measures: requests completed before `measure_from` (the ramp) count as work
/// but not as measurements, and no request is issued from `deadline` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The end of the ramp.
    pub measure_from: Instant,
    /// The end of the run.
    pub deadline: Instant,
}

impl Window {
    /// A window that starts `ramp` after `start` and lasts `runtime`.
    pub fn new(start: Instant, ramp: Duration, runtime: Duration) -> Window {
        let measure_from = start + ramp;
        Window {
            measure_from,
            deadline: measure_from + runtime,
        }
    }

    /// Whether a request issued at `now` belongs to the run.
    pub fn running(&self, now: Instant) -> bool {
        now < self.deadline
    }

    /// Whether a completion at `now` is measured (after the ramp, before the deadline).
    pub fn measures(&self, now: Instant) -> bool {
        now >= self.measure_from && now < self.deadline
    }
}
