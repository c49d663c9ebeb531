//! The bench's one error type, [`BenchError`]: what every subcommand of `aio-bench` returns,
//! and the exit code each error means.
//!
//! This module owns the exit codes: 2 for bad input (a flag or value, a job file, a directory,
//! too little free space, fio missing, a fast device that is malformed or cannot be set up:
//! found before a run starts, and nothing is left behind), 1 for a run that failed or found
//! errors (a backend refused, a request failed, `--verify` found mismatches, a report could
//! not be written). The other modules' errors ([`JobFileError`], [`LoopError`], [`FioError`],
//! [`RunError`], [`VhostError`]) convert into it with `?`; they never name it. It never prints: the binary prints
//! `aio-bench SUBCOMMAND: MESSAGE` and exits with [`BenchError::exit_code`]. (A signal's exit,
//! code 130, is [`crate::targets::cleanup`]'s.)

use std::io;

use crate::fio::jobfile::JobFileError;
use crate::fio::runner::RunError;
use crate::fio::FioError;
use crate::targets::loopdev::LoopError;
use crate::vhost::VhostError;

/// Why an `aio-bench` subcommand failed; [`exit_code`](BenchError::exit_code) says with which
/// code the binary exits.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Input that cannot be used, found before anything runs: a flag's value, a directory, too
    /// little free space (exit code 2). The message names the flag.
    #[error("{0}")]
    BadInput(String),
    /// A job file that cannot be read or parsed (exit code 2).
    #[error(transparent)]
    JobFile(#[from] JobFileError),
    /// The fast device: a malformed `--device`, or one that cannot be set up (exit code 2).
    #[error(transparent)]
    Device(#[from] LoopError),
    /// fio: not installed (exit code 2), or it failed or printed what cannot be read (exit
    /// code 1).
    #[error(transparent)]
    Fio(#[from] FioError),
    /// A job of a job file could not run (exit code 1).
    #[error(transparent)]
    Job(#[from] RunError),
    /// `aio-bench vhost`: bad input (a block size or queue count the device refuses, a daemon
    /// not installed, a CPU out of range: exit code 2) or a run that failed (exit code 1).
    #[error(transparent)]
    Vhost(#[from] VhostError),
    /// An I/O error while running or writing a report, with what was being done (exit code 1).
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`matrix: creating the images`, `--svg FILE`).
        what: String,
        /// The error.
        source: io::Error,
    },
    /// A run that failed or found errors: requests that failed, `--verify` mismatches (exit
    /// code 1).
    #[error("{0}")]
    Failed(String),
}

/// The exit code of bad input.
pub const EXIT_BAD_INPUT: u8 = 2;

/// The exit code of a run that failed.
pub const EXIT_FAILED: u8 = 1;

impl BenchError {
    /// Bad input (exit code 2): `message` names the flag or value and says what is wrong.
    pub fn bad_input(message: impl Into<String>) -> BenchError {
        BenchError::BadInput(message.into())
    }

    /// A run that failed (exit code 1).
    pub fn failed(message: impl Into<String>) -> BenchError {
        BenchError::Failed(message.into())
    }

    /// An I/O error while doing `what` (exit code 1).
    pub fn io(what: impl Into<String>, source: io::Error) -> BenchError {
        BenchError::Io {
            what: what.into(),
            source,
        }
    }

    /// The process's exit code for this error: [`EXIT_BAD_INPUT`] or [`EXIT_FAILED`].
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::BadInput(_)
            | BenchError::JobFile(_)
            | BenchError::Device(_)
            | BenchError::Job(RunError::InUse { .. })
            | BenchError::Job(RunError::NoSpace { .. })
            | BenchError::Fio(FioError::Missing) => EXIT_BAD_INPUT,
            BenchError::Vhost(e) if e.is_bad_input() => EXIT_BAD_INPUT,
            BenchError::Fio(_)
            | BenchError::Vhost(_)
            | BenchError::Job(_)
            | BenchError::Io { .. }
            | BenchError::Failed(_) => EXIT_FAILED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_exits_2_and_failures_1_with_the_message_unchanged() {
        let device = "nvme"
            .parse::<crate::targets::loopdev::LoopSpec>()
            .unwrap_err();
        let device_text = device.to_string();
        let cases: Vec<(BenchError, u8, String)> = vec![
            (
                BenchError::bad_input("--bs 7: must be a non-zero multiple of 512"),
                2,
                "--bs 7: must be a non-zero multiple of 512".into(),
            ),
            (device.into(), 2, device_text),
            (
                crate::fio::jobfile::parse("[j]\nrw=sideways\n", "t.fio".as_ref())
                    .unwrap_err()
                    .into(),
                2,
                "t.fio:2: rw=sideways".into(),
            ),
            (FioError::Missing.into(), 2, "fio is not installed".into()),
            (
                FioError::Output("no JSON object".into()).into(),
                1,
                "could not read fio's JSON output".into(),
            ),
            (
                RunError::Run {
                    job: "j".into(),
                    line: 3,
                    reason: "refused".into(),
                }
                .into(),
                1,
                "job 'j' (line 3): refused".into(),
            ),
            (
                BenchError::io("--csv out.csv", io::Error::other("disk full")),
                1,
                "--csv out.csv: disk full".into(),
            ),
            (
                VhostError::from(aio_vhost_user_blk::testing::ClientError::TooManyQueues {
                    socket: "/run/s.sock".into(),
                    asked: 4,
                    max: 2,
                })
                .into(),
                2,
                "--queues: 4 queue(s) asked for: the device at /run/s.sock has 2".into(),
            ),
            (
                VhostError::bad_input("--bs 1024: the device at s needs multiples of 4096").into(),
                2,
                "--bs 1024: the device at s needs multiples of 4096".into(),
            ),
            (
                VhostError::failed("queue 0: poll on the completion fd: EBADF").into(),
                1,
                "queue 0: poll on the completion fd: EBADF".into(),
            ),
            (
                BenchError::failed("verify found 3 mismatches"),
                1,
                "verify found 3 mismatches".into(),
            ),
        ];
        for (e, code, text) in cases {
            assert_eq!(e.exit_code(), code, "{e:?}");
            assert!(e.to_string().starts_with(&text), "'{e}' is not '{text}'");
        }
    }
}
