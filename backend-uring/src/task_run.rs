//! How the kernel finishes the engine's requests: io_uring's task-work modes.
//!
//! This module owns the ring's setup flags for completion delivery and the fallback between
//! them; the engine asks it only which mode it got. Never the submission path.
//!
//! A block read that the device completes in interrupt context is not posted to the
//! completion queue there: io_uring queues "task work" on the submitting thread and posts the
//! CQE when that thread runs it. The mode decides how the thread is made to run it:
//!
//! * [`TaskRun::Signal`] (the kernel's default): the thread is interrupted. A thread that is
//!   busy polling in user space gets an inter-processor interrupt; a thread that sleeps in
//!   `epoll_wait`/`ppoll` is woken with `EINTR`, runs the work on its way out, and the loop
//!   must wait again to see the eventfd the work just wrote: two kernel round trips per
//!   wake-up.
//! * [`TaskRun::Cooperative`] (`IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG`): no
//!   interrupt for a running thread; the kernel sets `IORING_SQ_TASKRUN` in the ring's shared
//!   flags instead, which the engine's `io_poll` check reads, and the engine enters the kernel
//!   to run the work (one `io_uring_enter` with `GETEVENTS`) when it sees the flag.
//! * [`TaskRun::Deferred`] (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN` plus the
//!   flag): the work waits until the engine asks for it (`GETEVENTS`) and the kernel signals
//!   the registered eventfd as soon as work is queued, so a sleeping loop wakes once, on its
//!   eventfd, with no `EINTR` round trip. The ring then belongs to the thread that created it
//!   (the engine is `!Send`, so it always is). fio's io_uring engine uses this mode.

use std::io;

use io_uring::IoUring;

/// How completions of the engine's requests are made visible (see the module docs of the
/// crate's [`UringConfig::task_run`](crate::UringConfig::task_run)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskRun {
    /// The best this kernel offers: [`TaskRun::Deferred`] (Linux 6.1), else
    /// [`TaskRun::Cooperative`] (5.19), else [`TaskRun::Signal`].
    #[default]
    Auto,
    /// The kernel's default: the loop thread is interrupted to post completions (an IPI while
    /// it polls, `EINTR` while it sleeps).
    Signal,
    /// `COOP_TASKRUN` with `TASKRUN_FLAG`: no interrupt; the `io_poll` check sees a flag and
    /// the engine enters the kernel to post the completions.
    Cooperative,
    /// `SINGLE_ISSUER | DEFER_TASKRUN` with `TASKRUN_FLAG`: completions are posted when the
    /// engine asks for them; the eventfd is written as soon as they are pending.
    Deferred,
}

impl TaskRun {
    /// The mode's name in job files and reports: `auto`, `signal`, `coop`, `defer`.
    pub fn name(self) -> &'static str {
        match self {
            TaskRun::Auto => "auto",
            TaskRun::Signal => "signal",
            TaskRun::Cooperative => "coop",
            TaskRun::Deferred => "defer",
        }
    }

    /// Parses [`TaskRun::name`].
    pub fn from_name(name: &str) -> Option<TaskRun> {
        [
            TaskRun::Auto,
            TaskRun::Signal,
            TaskRun::Cooperative,
            TaskRun::Deferred,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }

    /// Whether the kernel reports pending work through `IORING_SQ_TASKRUN` (and so the
    /// engine must enter the kernel when it sees it).
    pub(crate) fn uses_flag(self) -> bool {
        matches!(self, TaskRun::Cooperative | TaskRun::Deferred)
    }
}

/// The smallest ring [`build_ring`] shrinks to when the locked-memory limit refuses a larger
/// one.
pub(crate) const MIN_ENTRIES: u32 = 8;

/// Builds a ring of `entries` SQ and `cq_entries` CQ entries in `mode` (see
/// [`build_ring_exactly`]); where the kernel refuses it for memory (`ENOMEM`: Linux charges a
/// ring's pages to `RLIMIT_MEMLOCK` for users without `CAP_IPC_LOCK`, 64 KiB in many
/// containers), halves both sizes and tries again, down to [`MIN_ENTRIES`]: a smaller ring
/// queues more requests in user space, but works. The ring's `params()` say what it got.
pub(crate) fn build_ring(
    mut entries: u32,
    mut cq_entries: u32,
    mode: TaskRun,
) -> io::Result<(IoUring, TaskRun)> {
    loop {
        match build_ring_exactly(entries, cq_entries, mode) {
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && entries > MIN_ENTRIES => {
                entries = (entries / 2).max(MIN_ENTRIES);
                cq_entries = (cq_entries / 2).max(2 * entries);
            }
            other => return other,
        }
    }
}

/// Builds a ring of exactly `entries` SQ and `cq_entries` CQ entries in `mode`; `Auto` falls
/// back from the newest mode to the oldest when the kernel refuses a flag (`EINVAL`). Returns
/// the ring and the mode it runs in (never `Auto`).
fn build_ring_exactly(
    entries: u32,
    cq_entries: u32,
    mode: TaskRun,
) -> io::Result<(IoUring, TaskRun)> {
    let ladder: &[TaskRun] = match mode {
        TaskRun::Auto => &[TaskRun::Deferred, TaskRun::Cooperative, TaskRun::Signal],
        TaskRun::Deferred => &[TaskRun::Deferred],
        TaskRun::Cooperative => &[TaskRun::Cooperative],
        TaskRun::Signal => &[TaskRun::Signal],
    };
    let mut last = None;
    for &m in ladder {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(cq_entries);
        match m {
            TaskRun::Deferred => {
                builder
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag();
            }
            TaskRun::Cooperative => {
                builder.setup_coop_taskrun().setup_taskrun_flag();
            }
            TaskRun::Signal | TaskRun::Auto => {}
        }
        match builder.build(entries) {
            Ok(ring) => return Ok((ring, m)),
            // An older kernel that does not know the flag: try the next mode.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && ladder.len() > 1 => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in [
            TaskRun::Auto,
            TaskRun::Signal,
            TaskRun::Cooperative,
            TaskRun::Deferred,
        ] {
            assert_eq!(TaskRun::from_name(m.name()), Some(m));
        }
        assert_eq!(TaskRun::from_name("sqpoll"), None);
    }
}
