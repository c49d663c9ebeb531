//! Timers, the context's side: [`AioContext::timer_new`] and its kin, and running the timers
//! that expired (QEMU's `timerlist_run_timers`).
//!
//! This module owns those calls: it reads the clock, and runs expired callbacks after
//! releasing the table, which, with the deadline order, is `timer_table.rs`'s.

use std::rc::Rc;
use std::time::Duration;

use super::callback::LoopCallback;
use super::timer_table::TimerId;
use crate::AioContext;
use aio_core::AioError;
use aio_core::EventLoop;

impl<L: EventLoop> AioContext<L> {
    /// Creates a disarmed timer running `callback` when its deadline passes.
    pub fn timer_new(&self, callback: impl FnMut(&AioContext<L>) + 'static) -> TimerId {
        self.timers
            .borrow_mut()
            .create(Rc::new(LoopCallback::exclusive(callback)))
    }

    /// Arms `timer` for the absolute deadline `deadline_ns` on [`AioContext::now_ns`]'s clock
    /// (re-arming replaces the previous deadline). A deadline in the past fires in the next
    /// iteration. The timer never fires before its deadline.
    pub fn timer_mod(&self, timer: TimerId, deadline_ns: u64) -> Result<(), AioError> {
        if self.timers.borrow_mut().arm(timer, deadline_ns) {
            Ok(())
        } else {
            Err(AioError::UnknownTimer { id: timer.0 })
        }
    }

    /// Arms `timer` to fire `after` from now. A delay that overflows the 64-bit nanosecond
    /// clock is [`AioError::TimeoutOverflow`].
    pub fn timer_mod_in(&self, timer: TimerId, after: Duration) -> Result<(), AioError> {
        let now = self.now_ns();
        let deadline = u64::try_from(after.as_nanos())
            .ok()
            .and_then(|ns| now.checked_add(ns))
            .ok_or(AioError::TimeoutOverflow {
                requested_ns: after.as_nanos(),
                now_ns: now,
            })?;
        self.timer_mod(timer, deadline)
    }

    /// Disarms `timer` (it can be armed again).
    pub fn timer_del(&self, timer: TimerId) -> Result<(), AioError> {
        if self.timers.borrow_mut().disarm(timer) {
            Ok(())
        } else {
            Err(AioError::UnknownTimer { id: timer.0 })
        }
    }

    /// The deadline `timer` is armed for, `None` if disarmed.
    pub fn timer_deadline(&self, timer: TimerId) -> Result<Option<u64>, AioError> {
        self.timers
            .borrow_mut()
            .deadline(timer)
            .ok_or(AioError::UnknownTimer { id: timer.0 })
    }

    /// Frees `timer`; its id becomes unknown.
    pub fn timer_free(&self, timer: TimerId) -> Result<(), AioError> {
        let freed = self.timers.borrow_mut().free(timer);
        // Dropped outside the borrow: the callback's captures may call into the context.
        match freed {
            Some(callback) => {
                drop(callback);
                Ok(())
            }
            None => Err(AioError::UnknownTimer { id: timer.0 }),
        }
    }

    /// Runs the timers that expired by the time this call started and were armed before it:
    /// a callback that re-arms its timer in the past runs again in the next iteration, not in
    /// a loop here.
    pub(super) fn run_timers(&self) -> bool {
        let mut progress = false;
        let now = self.now_ns();
        let armed_before = self.timers.borrow().next_sequence();
        loop {
            let expired = self.timers.borrow_mut().pop_expired(now, armed_before);
            let Some((_, callback)) = expired else { break };
            // pop_expired skipped busy timers, so this one runs.
            self.count(|c| c.timer_runs += 1);
            progress |= callback.invoke(self);
        }
        progress
    }
}
