//! fio's side: running fio itself for the comparisons (`program`), fio's job files
//! ([`jobfile`]), one fio-like job on an attached engine ([`job`]), running job files through
//! aio-rs engines ([`runner`]) and fio's two report formats ([`output`]).
//!
//! This module owns everything that speaks fio's language; the backends and targets it runs
//! on are the `aio` crate's and `targets`.

pub mod job;
pub mod jobfile;
pub mod output;
mod program;
pub mod runner;

pub use program::{parse, run, version, FioError, FioResult};

/// The fio `ioengine` that runs the same kind of I/O as our engine `kind`: `psync` for the
/// thread pool, `libaio` for Linux AIO, `io_uring` for io_uring.
pub fn ioengine(kind: aio::EngineKind) -> &'static str {
    match kind {
        aio::EngineKind::Pool => "psync",
        aio::EngineKind::LinuxAio => "libaio",
        aio::EngineKind::Uring => "io_uring",
    }
}
