//! What the engine did, as plain numbers.
//!
//! This module owns `LinuxAioStats`; the engine fills it, nothing here counts.

/// What the engine did, as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinuxAioStats {
    /// `io_submit` calls.
    pub submit_calls: u64,
    /// iocbs the kernel accepted.
    pub iocbs_submitted: u64,
    /// `io_submit` calls that returned `EAGAIN`.
    pub submit_eagain: u64,
    /// Requests failed by `io_submit` itself (the head of a batch).
    pub submit_errors: u64,
    /// Remainders resubmitted after a short transfer, or after `-EAGAIN` / `-EINTR`.
    pub resubmits: u64,
    /// Events read from the user-space ring.
    pub ring_events: u64,
    /// `io_getevents` calls (the fallback, and blocking waits in drain and drop).
    pub getevents_calls: u64,
    /// `io_getevents` and `io_submit` calls a signal interrupted (`EINTR`), retried.
    pub interrupted_calls: u64,
    /// Requests on files without `O_DIRECT`.
    pub buffered_requests: u64,
    /// Writes with [`RwFlags::FUA`](aio_core::engine::RwFlags::FUA) (`aio_rw_flags = RWF_DSYNC`).
    pub fua_writes: u64,
}
