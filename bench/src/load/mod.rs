//! What every workload needs, whichever way its requests reach the target: the pattern and the
//! offset stream (sequential or random blocks, the read/write mix, a deterministic RNG per
//! worker), the latency histogram, the ramp and the measured window, and the verify stamps.
//!
//! This module owns those pieces; the load generators that use them are the job on an
//! attached engine (`fio::job`), the matrix's guests (`scsi::guest`), the Rust peers
//! (`aio-bench peers`) and the libblkio client (`vhost`). It never submits a request.

mod pattern;
pub mod verify;

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

pub use pattern::{Direction, OffsetStream, Pattern, Rng};

/// A latency histogram in ns (1 ns to 60 s, 3 significant digits), as every report uses.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
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
