//! `aio-bench probe`: which fd monitors and engines this build and kernel offer, why any is
//! unusable, what `auto` picks and why ([`aio::probe`]), and which fio is installed.
//!
//! This module owns printing the report. It never fails: an unusable backend is a line of the
//! report.

use aio_bench::error::BenchError;
use aio_bench::fio;

/// Prints the probe's report.
pub fn run() -> Result<(), BenchError> {
    print!("{}", aio::probe());
    match fio::version() {
        Ok(v) => println!("fio: {v}"),
        Err(e) => println!("fio: {e}"),
    }
    Ok(())
}
