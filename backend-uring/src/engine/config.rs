//! The engine's settings and numbers: [`UringConfig`] with its checks, applied to a ring, and
//! [`UringStats`].
//!
//! This module owns what a caller sets and reads; the ring's use is `mod.rs`'s.

use aio_core::engine::DEFAULT_MAX_BATCH;
use aio_core::kit::BadConfig;

use crate::probe::UringUnavailable;
use crate::registered_buffers::MAX_REGISTERED_BUFFERS;
use crate::task_run::TaskRun;

/// Engine settings: [`UringConfig::default`] and the `with_*` setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UringConfig {
    /// Submission queue entries (the completion queue is twice as large). Default 128. Where
    /// the locked-memory limit refuses a ring that large, a smaller one is set up (halved down
    /// to 8 entries; [`sq_entries`](crate::UringEngine::sq_entries) says what it got), and
    /// only then is it [`UringUnavailable::OutOfLockedMemory`].
    pub entries: u32,
    /// Most entries per `io_uring_enter`. Default 32.
    pub max_batch: usize,
    /// Register each file once (`IORING_REGISTER_FILES`) and submit with fixed-file indexes,
    /// saving the kernel an fd lookup and reference per request. Default off.
    pub register_files: bool,
    /// Slots of a registered-buffer table (0: off, the default; at most
    /// [`MAX_REGISTERED_BUFFERS`]). Single-buffer reads and writes then use
    /// `IORING_OP_READ_FIXED` / `WRITE_FIXED`: each buffer allocation is registered on its
    /// first use (its pages pinned once, saving the kernel the page lookup and pinning of every
    /// request) and keeps its slot while requests bring it back. When every slot is in use a
    /// request goes without; vectored requests and buffers over 1 GiB always do. If the
    /// kernel refuses a registration for lack of lockable memory (`ENOMEM`, the memlock limit)
    /// or permission, the engine goes on without registered buffers and says why in
    /// [`UringEngine::fixed_buffers_error`](crate::UringEngine::fixed_buffers_error); another refusal affects that buffer only.
    ///
    /// Requests on memory a caller lends ([`LentMemory`](aio_core::engine::LentMemory)) always go
    /// without: the engine does not register memory it does not own.
    ///
    /// Meant for buffers that are reused (a request pool): a freed
    /// buffer's pages stay pinned, and counted against the memlock limit, until its slot is
    /// given to another buffer, and a new allocation per request costs one `io_uring_register`
    /// call per request.
    pub fixed_buffers: u32,
    /// How completions are made visible to the loop (io_uring's task-work modes). Default
    /// [`TaskRun::Auto`]: deferred task work where the kernel has it (6.1), so a busy-polling
    /// loop is never interrupted and a sleeping one wakes once, on its eventfd (or, on a
    /// [`shared_ring`](crate::shared_ring), in the monitor's own wait).
    pub task_run: TaskRun,
    /// The most io-wq workers the kernel runs for this ring's file work that cannot complete
    /// inline (`IORING_REGISTER_IOWQ_MAX_WORKERS`, the bounded limit): discard and
    /// write-zeroes (`fallocate` always runs in a worker), buffered writes, O_DIRECT on tmpfs.
    /// `None` (the default) keeps the kernel's limit (the CPU count, capped by
    /// `RLIMIT_NPROC`). Work that serialises on a lock of one file, like `fallocate` on ext4,
    /// runs faster in fewer workers (BENCHMARKS.md, "Discard and write-zeroes").
    pub io_workers: Option<u32>,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            entries: 128,
            max_batch: DEFAULT_MAX_BATCH,
            register_files: false,
            fixed_buffers: 0,
            task_run: TaskRun::Auto,
            io_workers: None,
        }
    }
}

aio_core::kit::with_setters!(UringConfig {
    /// With `entries` submission-queue entries (1..=32768; the CQ is twice as large).
    with_entries => entries: u32,
    /// With at most `max_batch` entries per `io_uring_enter` (at least 1).
    with_max_batch => max_batch: usize,
    /// With registered files on or off.
    with_register_files => register_files: bool,
    /// With a registered-buffer table of `fixed_buffers` (0: off).
    with_fixed_buffers => fixed_buffers: u32,
    /// With the task-work mode `task_run`.
    with_task_run => task_run: TaskRun,
    /// With at most `io_workers` io-wq workers for file work (`None`: the kernel's limit).
    with_io_workers => io_workers: Option<u32>,
});

/// io_uring's limit on submission-queue entries (`IORING_MAX_ENTRIES`).
pub const MAX_ENTRIES: u32 = 32_768;

/// Refuses settings the kernel would refuse later, with an error that names them.
pub(crate) fn check_config(config: &UringConfig) -> Result<(), UringUnavailable> {
    let bad = |field, reason: String| BadConfig::new("UringConfig", field, reason).into();
    if config.entries == 0 || config.entries > MAX_ENTRIES {
        return Err(bad(
            "entries",
            format!("{} is outside 1..={MAX_ENTRIES}", config.entries),
        ));
    }
    if config.max_batch == 0 {
        return Err(bad("max_batch", "0: at least 1 entry per enter".into()));
    }
    if config.io_workers == Some(0) {
        return Err(bad(
            "io_workers",
            "Some(0): at least 1 worker (None keeps the kernel's limit)".into(),
        ));
    }
    if config.fixed_buffers > MAX_REGISTERED_BUFFERS {
        return Err(bad(
            "fixed_buffers",
            format!(
                "{} is more than the kernel's {MAX_REGISTERED_BUFFERS} registered buffers",
                config.fixed_buffers
            ),
        ));
    }
    Ok(())
}

/// Applies [`UringConfig::io_workers`] to `ring`.
pub(super) fn limit_io_workers(
    ring: &io_uring::IoUring,
    config: &UringConfig,
) -> Result<(), UringUnavailable> {
    if let Some(workers) = config.io_workers {
        // [bounded, unbounded]; 0 leaves the unbounded (network) limit as it is.
        let mut limits = [workers, 0];
        ring.submitter()
            .register_iowq_max_workers(&mut limits)
            .map_err(UringUnavailable::Other)?;
    }
    Ok(())
}

/// How many files the registered table holds; beyond that, requests use plain fds.
pub const REGISTERED_FILES: u32 = 1024;

/// What the engine did, as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringStats {
    /// `io_uring_enter` calls made to submit.
    pub submit_calls: u64,
    /// Entries the kernel consumed in the engine's own enters (on a shared ring, those the
    /// monitor's wait sends are not counted here).
    pub entries_submitted: u64,
    /// Times the submission queue was full and requests waited.
    pub sq_full: u64,
    /// Remainders resubmitted (short transfers, `-EAGAIN`, `-EINTR`).
    pub resubmits: u64,
    /// Completions reaped from the completion queue.
    pub cqes: u64,
    /// Times the kernel reported completion-queue overflow and we flushed it.
    pub cq_overflows: u64,
    /// Requests submitted with a registered file.
    pub fixed_file_requests: u64,
    /// Requests submitted with a registered buffer (`READ_FIXED` / `WRITE_FIXED`).
    pub fixed_buffer_requests: u64,
    /// Buffers registered (`io_uring_register` calls that filled a slot).
    pub buffer_registrations: u64,
    /// Registrations the kernel refused for one buffer (that request went without).
    pub buffer_registrations_refused: u64,
    /// `io_uring_enter` calls made to run pending task work (the `IORING_SQ_TASKRUN` flag
    /// was set; [`TaskRun::Cooperative`] and [`TaskRun::Deferred`] only).
    pub task_run_enters: u64,
    /// Writes with [`RwFlags::FUA`](aio_core::engine::RwFlags::FUA) (an SQE `rw_flags` of `RWF_DSYNC`).
    pub fua_writes: u64,
    /// Discards and write-zeroes hard-linked to the next one on the same file, so that one
    /// io-wq worker runs them in turn.
    pub linked_range_ops: u64,
    /// `IORING_OP_ASYNC_CANCEL` entries sent for requests in the kernel.
    pub cancels_sent: u64,
    /// `io_uring_enter` calls of the engine a signal interrupted (`EINTR`), retried.
    pub interrupted_calls: u64,
}
