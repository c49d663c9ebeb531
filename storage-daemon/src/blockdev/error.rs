//! [`QsdError`]: an option (of the command line, or a QMP command's arguments) that the
//! block graph does not take, naming the option and what is wrong.
//!
//! This module owns the error type; it names no other file, so every reader may return it.

/// What the daemon does not take in a qemu-storage-daemon option or a QMP command's arguments
/// (exit code 2 on the command line, `GenericError` over QMP).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QsdError {
    /// An option is malformed or inconsistent: it and what is wrong.
    #[error("{option}: {reason}")]
    Invalid {
        /// The option as given (`--blockdev driver=...`).
        option: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An option asks for something qemu-storage-daemon serves and this daemon does not.
    #[error("{option}: {what} is not served by aio-storage-daemon")]
    NotServed {
        /// The option as given.
        option: String,
        /// What it asks for.
        what: String,
    },
}

impl From<QsdError> for std::io::Error {
    fn from(e: QsdError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}
