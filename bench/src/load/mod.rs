//! What every workload needs, whichever way its requests reach the target: the pattern and the
//! offset stream (sequential or random blocks, the read/write mix, a deterministic RNG per
//! worker), the latency histogram, the ramp and the measured window, the tally of what finished
//! in it, and the verify stamps.
//!
//! This module owns those pieces and the one load generator built of them
//! ([`Generator`], with [`drive()`] to keep a [`Target`] busy).
//! The matrix's virtqueues (`scsi::guest`) and the libblkio client's queues (`vhost`) are its
//! targets; the job on an attached engine (`fio::job`) calls it from its completion callbacks
//! and the Rust peers (`aio-bench peers`) from each worker task. It never submits a request
//! itself.

mod drive;
pub mod generator;
mod pattern;
mod tally;
pub mod verify;

pub use drive::{drive, DriveError, Target};
pub use generator::{Generator, Issued, Layout, LoadFigures, LoadSpec};
pub use pattern::{Direction, OffsetStream, Pattern};
pub use tally::{latency_histogram, Tally, Window};
