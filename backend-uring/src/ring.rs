//! A ring owned by one user, or shared by the fd monitor and the engine.
//!
//! This module owns the `IoUring` and the routing of its completions. With one ring for both
//! (QEMU's newest design, [`shared_ring`](crate::shared_ring)), block I/O completions arrive in
//! the same completion queue the monitor waits on, so they need no eventfd: whoever drains the
//! queue sorts entries by user data (bit 63 set: the engine's; clear: the monitor's) into
//! per-owner lists, and the monitor reports the engine's notifier fd as readable whenever
//! engine completions are waiting.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;

use io_uring::{squeue, IoUring};

/// User data bit marking the engine's entries on a shared ring.
pub(crate) const ENGINE_BIT: u64 = 1 << 63;

/// User data bit marking the engine's `ASYNC_CANCEL` entries, whose own completion says only
/// whether the target was found (the target's completion carries `-ECANCELED`).
pub(crate) const CANCEL_BIT: u64 = 1 << 62;

/// Hands every completion in the CQ to `f` (user data, result), flushing completions the
/// kernel kept aside on overflow; returns how many overflow flushes were needed.
pub(crate) fn drain_cq(ring: &mut IoUring, mut f: impl FnMut(u64, i32)) -> u64 {
    let mut flushes = 0;
    loop {
        let mut got = 0;
        for cqe in ring.completion() {
            got += 1;
            f(cqe.user_data(), cqe.result());
        }
        // SAFETY: a transient view of the SQ flags; no SubmissionQueue is alive.
        let overflow = unsafe { ring.submission_shared() }.cq_overflow();
        if overflow {
            flushes += 1;
            let _ = ring.submit();
            continue;
        }
        if got == 0 {
            return flushes;
        }
    }
}

/// The state of a shared ring.
pub(crate) struct SharedCore {
    pub(crate) ring: IoUring,
    /// Engine completions drained by the monitor: `(slot, res)`.
    pub(crate) io_results: Vec<(u32, i32)>,
    /// Monitor completions drained by the engine: `(user_data, res)`.
    pub(crate) poll_results: Vec<(u64, i32)>,
    /// The engine's notifier fd: reported readable when engine completions wait.
    pub(crate) engine_fd: Option<RawFd>,
    /// The engine has completions of its own (e.g. a cancel) the loop must come for.
    pub(crate) engine_kick: bool,
}

impl SharedCore {
    /// Moves every completion out of the CQ into the owners' lists (flushing overflow).
    pub(crate) fn drain(&mut self) -> u64 {
        let (io, polls) = (&mut self.io_results, &mut self.poll_results);
        drain_cq(&mut self.ring, |data, res| {
            if data & ENGINE_BIT != 0 {
                if data & CANCEL_BIT == 0 {
                    io.push((data as u32, res));
                }
            } else {
                polls.push((data, res));
            }
        })
    }

    /// Whether the engine has something for the loop.
    pub(crate) fn engine_ready(&self) -> bool {
        self.engine_kick || !self.io_results.is_empty()
    }
}

/// A ring: its own, or one shared with the other side.
pub(crate) enum RingHandle {
    Own(Box<IoUring>),
    Shared(Rc<RefCell<SharedCore>>),
}

impl RingHandle {
    /// Runs `f` with the ring.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&IoUring) -> R) -> R {
        match self {
            RingHandle::Own(r) => f(r),
            RingHandle::Shared(c) => f(&c.borrow().ring),
        }
    }

    /// Pushes one entry, submitting to make room when the SQ is full.
    ///
    /// # Safety
    /// Whatever memory the entry refers to must stay valid until its completion.
    pub(crate) unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: forwarded from the caller.
            if unsafe { self.try_push(entry) } {
                return Ok(());
            }
            match self.with(|r| r.submit()) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Tries to push one entry; false when the SQ is full.
    ///
    /// # Safety
    /// As [`RingHandle::push`].
    pub(crate) unsafe fn try_push(&mut self, entry: &squeue::Entry) -> bool {
        let mut shared;
        let ring: &mut IoUring = match self {
            RingHandle::Own(r) => r,
            RingHandle::Shared(c) => {
                shared = c.borrow_mut();
                &mut shared.ring
            }
        };
        let mut sq = ring.submission();
        // SAFETY: forwarded from the caller: the entry's memory outlives its completion.
        unsafe { sq.push(entry) }.is_ok()
    }
}
