//! fio's side: running fio itself for the comparisons (`program`), fio's job files
//! ([`jobfile`]), one fio-like job on an attached engine ([`job`]), running job files through
//! aio-rs engines ([`runner`]) and fio's two report formats ([`output`]).
//!
//! This module owns everything that speaks fio's language; the backends and targets it runs
//! on are `backends` and `targets`.

pub mod job;
pub mod jobfile;
pub mod output;
mod program;
pub mod runner;

pub use program::{parse, run, version, FioError, FioResult};
