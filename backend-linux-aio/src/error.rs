//! Why an engine cannot be created.
//!
//! This module owns `LinuxAioError` and its `io::Error` conversion; it never retries.

use std::io;

use aio_core::kit::BadConfig;

/// Why a Linux AIO engine cannot be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinuxAioError {
    /// The system-wide limit of AIO events is reached.
    #[error(
        "io_setup({requested}) failed with EAGAIN: {aio_nr} of /proc/sys/fs/aio-max-nr = {aio_max_nr} \
         AIO events are in use system-wide; raise the limit (sysctl fs.aio-max-nr) or use a smaller ring"
    )]
    AioMaxNr {
        /// Events this engine asked for.
        requested: u32,
        /// `/proc/sys/fs/aio-nr` (in use), if readable.
        aio_nr: String,
        /// `/proc/sys/fs/aio-max-nr` (the limit), if readable.
        aio_max_nr: String,
    },
    /// The kernel has no Linux AIO (`ENOSYS`) or a seccomp filter refuses it (`EPERM`).
    #[error("Linux AIO is not available here: io_setup failed: {0}")]
    Unavailable(#[source] io::Error),
    /// A setting of [`LinuxAioConfig`](crate::LinuxAioConfig) that cannot work, named.
    #[error(transparent)]
    BadConfig(#[from] BadConfig),
    /// Another failure creating the context or its eventfd.
    #[error("creating the Linux AIO engine failed: {0}")]
    Io(#[source] io::Error),
}

aio_core::kit::io_error_from!(LinuxAioError, |e| match e {
    LinuxAioError::AioMaxNr { .. } => io::ErrorKind::WouldBlock,
    LinuxAioError::Unavailable(s) | LinuxAioError::Io(s) => s.kind(),
    LinuxAioError::BadConfig(_) => io::ErrorKind::InvalidInput,
});
