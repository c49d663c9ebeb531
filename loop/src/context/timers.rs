//! Timers with nanosecond deadlines on the context's clock.
//!
//! This module owns the timer table and the deadline order. It never reads the clock or calls a
//! callback: the context passes the time in and runs expired callbacks after releasing the table.

use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use crate::AioContext;
use aio_core::AioError;

use super::callback::LoopCallback;
use aio_core::kit::{SlotId, Slots};
use aio_core::EventLoop;

/// Identifies a timer within its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(pub(crate) u64);

impl TimerId {
    /// The raw id (for error messages and logs).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

struct TimerSlot<L: EventLoop> {
    callback: Rc<LoopCallback<AioContext<L>>>,
    /// `(deadline, sequence)` while armed.
    armed: Option<(u64, u64)>,
}

pub(crate) struct TimerTable<L: EventLoop> {
    slots: Slots<TimerSlot<L>>,
    next_sequence: u64,
    /// Armed timers by `(deadline, arming sequence, id)`: deadline order, ties in arming order.
    order: BTreeSet<(u64, u64, u64)>,
}

impl<L: EventLoop> TimerTable<L> {
    pub(crate) fn new() -> Self {
        TimerTable {
            slots: Slots::new(),
            next_sequence: 0,
            order: BTreeSet::new(),
        }
    }

    fn slot_mut(&mut self, id: TimerId) -> Option<&mut TimerSlot<L>> {
        self.slots.get_mut(SlotId::from_u64(id.0))
    }

    pub(crate) fn create(&mut self, callback: Rc<LoopCallback<AioContext<L>>>) -> TimerId {
        let id = self.slots.insert(TimerSlot {
            callback,
            armed: None,
        });
        TimerId(id.to_u64())
    }

    /// Arms (or re-arms) a timer; false if the id is unknown.
    pub(crate) fn arm(&mut self, id: TimerId, deadline: u64) -> bool {
        let sequence = self.next_sequence;
        let Some(slot) = self.slot_mut(id) else {
            return false;
        };
        let old = slot.armed.replace((deadline, sequence));
        if let Some((d, s)) = old {
            self.order.remove(&(d, s, id.0));
        }
        self.order.insert((deadline, sequence, id.0));
        self.next_sequence += 1;
        true
    }

    /// Disarms a timer; false if the id is unknown.
    pub(crate) fn disarm(&mut self, id: TimerId) -> bool {
        let Some(slot) = self.slot_mut(id) else {
            return false;
        };
        if let Some((d, s)) = slot.armed.take() {
            self.order.remove(&(d, s, id.0));
        }
        true
    }

    pub(crate) fn deadline(&mut self, id: TimerId) -> Option<Option<u64>> {
        self.slot_mut(id).map(|s| s.armed.map(|(d, _)| d))
    }

    /// Frees a timer; returns its callback for the caller to drop outside the table borrow.
    pub(crate) fn free(&mut self, id: TimerId) -> Option<Rc<LoopCallback<AioContext<L>>>> {
        if !self.disarm(id) {
            return None;
        }
        self.slots
            .remove(SlotId::from_u64(id.0))
            .map(|slot| slot.callback)
    }

    /// The sequence number the next arming will get.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    fn is_running(&self, raw: u64) -> bool {
        self.slots
            .get(SlotId::from_u64(raw))
            .is_some_and(|s| s.callback.is_busy())
    }

    /// The earliest deadline among armed timers whose callback is not running further up the
    /// stack (a running timer cannot fire until it returns, so it must not shorten the wait).
    pub(crate) fn earliest_runnable(&self) -> Option<u64> {
        self.order
            .iter()
            .find(|(_, _, raw)| !self.is_running(*raw))
            .map(|(d, _, _)| *d)
    }

    /// Disarms and returns the earliest timer whose deadline is `<= now` and that was armed
    /// before sequence `armed_before`, skipping timers whose callback is running further up
    /// the stack (they stay armed and fire once it returns).
    pub(crate) fn pop_expired(
        &mut self,
        now: u64,
        armed_before: u64,
    ) -> Option<(TimerId, Rc<LoopCallback<AioContext<L>>>)> {
        let &(deadline, sequence, raw) = self
            .order
            .iter()
            .take_while(|(d, _, _)| *d <= now)
            .find(|(_, s, raw)| *s < armed_before && !self.is_running(*raw))?;
        let id = TimerId(raw);
        let slot = self.slot_mut(id)?;
        slot.armed = None;
        let callback = slot.callback.clone();
        self.order.remove(&(deadline, sequence, raw));
        Some((id, callback))
    }
}

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
