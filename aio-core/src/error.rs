//! Typed errors of the loop and of the monitors.
//!
//! This module owns [`AioError`] and its conversion to `io::Error`. Every way a caller can hand
//! the loop bad input ends here, as a value: the loop itself keeps running.

use std::io;
use std::os::fd::RawFd;

/// An error of the loop (`aio-loop`'s `AioContext`, its attached engines and iothreads) or of
/// a monitor adapter (the facade's `Hybrid`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AioError {
    /// `set_fd_handler` for an fd that already has a handler in this context.
    #[error("fd {fd} already has a handler in this context (use update_fd_handler to change it)")]
    AlreadyRegistered {
        /// The fd.
        fd: RawFd,
    },
    /// The fd is negative or not open in this process.
    #[error("fd {fd} is not an open file descriptor")]
    InvalidFd {
        /// The fd.
        fd: RawFd,
    },
    /// Change or removal of an fd that has no handler in this context.
    #[error("fd {fd} has no handler in this context")]
    NotRegistered {
        /// The fd.
        fd: RawFd,
    },
    /// A handler with no `io_read`, `io_write` or `io_poll` callback.
    #[error("the handler for fd {fd} has no io_read, io_write or io_poll callback")]
    NoCallbacks {
        /// The fd.
        fd: RawFd,
    },
    /// A deadline or timeout that does not fit the loop's nanosecond clock.
    #[error(
        "timeout of {requested_ns} ns from now ({now_ns} ns) overflows the 64-bit nanosecond clock"
    )]
    TimeoutOverflow {
        /// The requested relative timeout, in ns (saturated to u128).
        requested_ns: u128,
        /// The clock reading it was added to.
        now_ns: u64,
    },
    /// A timer id that this context does not know (deleted, or from another context).
    #[error("timer {id} does not exist in this context")]
    UnknownTimer {
        /// The timer id.
        id: u64,
    },
    /// A bottom half that was deleted or belongs to another context.
    #[error("bottom half {id} does not exist in this context")]
    UnknownBottomHalf {
        /// The bottom-half id.
        id: u64,
    },
    /// The fd monitor refused an operation.
    #[error("{monitor}: {op} of fd {fd} failed: {source}")]
    Monitor {
        /// The monitor's name.
        monitor: &'static str,
        /// `"register"`, `"modify"` or `"deregister"`.
        op: &'static str,
        /// The fd.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// Waiting for events failed with something other than `EINTR`.
    #[error("{monitor}: wait failed: {source}")]
    Wait {
        /// The monitor's name.
        monitor: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// `detach` of an engine from inside a callback of its context.
    #[error("an engine cannot be detached from inside a callback of its context")]
    EngineBusy,
    /// `detach` of an engine while other handles or unfinished futures still hold it.
    #[error("the engine cannot be detached: {holders} other handles or futures still hold it")]
    EngineShared {
        /// How many.
        holders: usize,
    },
    /// `detach` with a context the engine is not attached to.
    #[error("the engine is attached to another context")]
    WrongContext,
    /// Creating the context's own notifier failed.
    #[error("creating the context notifier failed: {0}")]
    Notifier(#[source] io::Error),
}

// The kit's `io_error_from!`, named at the crate root (where `#[macro_export]` puts it) so
// that the error does not import the kit's module.
crate::__io_error_from!(AioError, |e| match e {
    AioError::AlreadyRegistered { .. } => io::ErrorKind::AlreadyExists,
    AioError::InvalidFd { .. } | AioError::NoCallbacks { .. } => {
        io::ErrorKind::InvalidInput
    }
    AioError::TimeoutOverflow { .. } => io::ErrorKind::InvalidInput,
    AioError::EngineBusy | AioError::EngineShared { .. } => io::ErrorKind::ResourceBusy,
    AioError::WrongContext => io::ErrorKind::InvalidInput,
    AioError::NotRegistered { .. }
    | AioError::UnknownTimer { .. }
    | AioError::UnknownBottomHalf { .. } => io::ErrorKind::NotFound,
    AioError::Monitor { source, .. }
    | AioError::Wait { source, .. }
    | AioError::Notifier(source) => source.kind(),
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_to_io_error_with_kind_and_message() {
        let e: io::Error = AioError::AlreadyRegistered { fd: 5 }.into();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("fd 5"));
        let e: io::Error = AioError::NotRegistered { fd: 9 }.into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
