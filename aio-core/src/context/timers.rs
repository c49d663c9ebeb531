//! Timers with nanosecond deadlines on the context's clock.
//!
//! This module owns the timer table and the deadline order. It never reads the clock or calls a
//! callback: the context passes the time in and runs expired callbacks after releasing the table.

use std::collections::BTreeSet;
use std::rc::Rc;

use super::handlers::LoopCallback;
use crate::event_loop::EventLoop;

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
    generation: u32,
    callback: Rc<LoopCallback<L>>,
    /// `(deadline, sequence)` while armed.
    armed: Option<(u64, u64)>,
}

pub(crate) struct TimerTable<L: EventLoop> {
    slots: Vec<Option<TimerSlot<L>>>,
    free: Vec<u32>,
    next_generation: u32,
    next_sequence: u64,
    /// Armed timers by `(deadline, arming sequence, id)`: deadline order, ties in arming order.
    order: BTreeSet<(u64, u64, u64)>,
}

impl<L: EventLoop> TimerTable<L> {
    pub(crate) fn new() -> Self {
        TimerTable {
            slots: Vec::new(),
            free: Vec::new(),
            next_generation: 1,
            next_sequence: 0,
            order: BTreeSet::new(),
        }
    }

    fn slot_mut(&mut self, id: TimerId) -> Option<&mut TimerSlot<L>> {
        let index = (id.0 & 0xffff_ffff) as usize;
        let generation = (id.0 >> 32) as u32;
        match self.slots.get_mut(index) {
            Some(Some(s)) if s.generation == generation => Some(s),
            _ => None,
        }
    }

    pub(crate) fn create(&mut self, callback: Rc<LoopCallback<L>>) -> TimerId {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let slot = TimerSlot {
            generation,
            callback,
            armed: None,
        };
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        TimerId(((generation as u64) << 32) | index as u64)
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
    pub(crate) fn free(&mut self, id: TimerId) -> Option<Rc<LoopCallback<L>>> {
        if !self.disarm(id) {
            return None;
        }
        let index = (id.0 & 0xffff_ffff) as usize;
        let slot = self.slots[index].take()?;
        self.free.push(index as u32);
        Some(slot.callback)
    }

    /// The sequence number the next arming will get.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    fn is_running(&self, raw: u64) -> bool {
        let index = (raw & 0xffff_ffff) as usize;
        matches!(self.slots.get(index), Some(Some(s)) if s.callback.is_busy())
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
    ) -> Option<(TimerId, Rc<LoopCallback<L>>)> {
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
