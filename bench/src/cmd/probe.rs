//! `aio-bench probe`: which fd monitors and engines this build and kernel offer, and what
//! `auto` picks.
//!
//! This module owns printing the report; the report itself is [`aio_bench::backends::probe::report`].
//! It never fails: an unusable backend is a line of the report.

use aio_bench::error::BenchError;

/// Prints the probe's report.
pub fn run() -> Result<(), BenchError> {
    print!("{}", aio_bench::backends::probe::report());
    Ok(())
}
