//! The vhost side's one error type, [`VhostError`]: what the client, the daemons and the
//! comparison return.
//!
//! This module owns the vhost side's failures and which of them are bad input (found before a
//! run: a block size or a queue count the device refuses, a daemon that is not installed, a
//! CPU out of range); never the exit codes, which are the bench's (`BenchError`, which a
//! [`VhostError`] converts into).

use std::io;

use aio_test_support::launch::LaunchError;
use aio_vhost_user_blk::testing::ClientError;

/// Why a vhost-user-blk run failed; [`is_bad_input`](VhostError::is_bad_input) says whether
/// it was refused before it ran.
#[derive(Debug, thiserror::Error)]
pub enum VhostError {
    /// Input the device cannot take, found before the run: a block size, a device too small
    /// for the job. The message names the flag.
    #[error("{0}")]
    BadInput(String),
    /// A run that failed: a request, a verify mismatch, a daemon that stopped answering or
    /// vanished, a queue that could not be set up.
    #[error("{0}")]
    Failed(String),
    /// An I/O error, with what was being done (`creating DIR`).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// A daemon that could not be started, or that ended (with its status, command line and
    /// output).
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// libblkio refused or failed (a queue count the device does not have names `--queues`).
    #[error("{}{}", flag_of(.0), .0)]
    Client(#[from] ClientError),
}

/// The flag a client error is about, as a prefix of its message (`--queues: `), or nothing.
fn flag_of(e: &ClientError) -> &'static str {
    match e {
        ClientError::TooManyQueues { .. } => "--queues: ",
        ClientError::Blkio { .. } | ClientError::NoAnswer { .. } => "",
    }
}

impl VhostError {
    /// Input the device cannot take: `message` names the flag and says what is wrong.
    pub fn bad_input(message: impl Into<String>) -> VhostError {
        VhostError::BadInput(message.into())
    }

    /// A run that failed.
    pub fn failed(message: impl Into<String>) -> VhostError {
        VhostError::Failed(message.into())
    }

    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>, source: io::Error) -> VhostError {
        VhostError::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether the run was refused before it started (bad input: a flag's value, a missing
    /// program, a CPU out of range) rather than failed.
    pub fn is_bad_input(&self) -> bool {
        match self {
            VhostError::BadInput(_)
            | VhostError::Launch(LaunchError::NotInstalled { .. } | LaunchError::BadCpu { .. })
            | VhostError::Client(ClientError::TooManyQueues { .. }) => true,
            VhostError::Failed(_)
            | VhostError::Io { .. }
            | VhostError::Launch(LaunchError::Io { .. } | LaunchError::Failed { .. })
            | VhostError::Client(ClientError::Blkio { .. } | ClientError::NoAnswer { .. }) => false,
        }
    }
}
