//! Bottom halves, the context's side: [`AioContext::bh_new`] and its kin, and running the
//! bottom halves scheduled so far (QEMU's `aio_bh_poll`).
//!
//! This module owns creating and deleting bottom halves on the context, whether one waits to
//! run (which shapes the wait's timeout), and the run order: once per schedule, a schedule
//! made while they run goes to the next iteration, a nested `poll()` drains the outer slices
//! too, a callback running further up the stack keeps its schedule for later. The schedule
//! state, the [`BottomHalf`] handle and the table are `bh_table.rs`'s.

use std::rc::Rc;
use std::sync::Arc;

use super::bh_queue::{BhEntry, DELETE_TICKET};
use super::bh_table::{BhSlot, BhState, BhWait, BottomHalf};
use super::callback::LoopCallback;
use crate::AioContext;
use aio_core::kit::SlotId;
use aio_core::AioError;
use aio_core::EventLoop;

/// Whether a bottom half outlives its first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifetime {
    /// Until deleted (`bh_new`).
    Kept,
    /// Freed after it runs once (`bh_schedule_oneshot`).
    Oneshot,
}

impl<L: EventLoop> AioContext<L> {
    /// Creates a bottom half running `callback` on the loop thread, once per schedule.
    pub fn bh_new(&self, callback: impl FnMut(&AioContext<L>) + 'static) -> BottomHalf {
        self.bh_create(LoopCallback::exclusive(callback), Lifetime::Kept)
    }

    /// Creates a bottom half whose callback a nested `poll()` may re-enter: scheduled again
    /// while it runs, it runs again in the next iteration of a nested loop (QEMU's semantics),
    /// where a [`AioContext::bh_new`] one waits until it has returned.
    pub fn bh_new_reentrant(&self, callback: impl Fn(&AioContext<L>) + 'static) -> BottomHalf {
        self.bh_create(LoopCallback::reentrant(callback), Lifetime::Kept)
    }

    /// Schedules `callback` to run once in the next iteration, then frees it (QEMU's
    /// `aio_bh_schedule_oneshot`).
    pub fn bh_schedule_oneshot(&self, callback: impl FnOnce(&AioContext<L>) + 'static) {
        let mut callback = Some(callback);
        let bh = self.bh_create(
            LoopCallback::exclusive(move |ctx| {
                if let Some(f) = callback.take() {
                    f(ctx)
                }
            }),
            Lifetime::Oneshot,
        );
        bh.schedule();
    }

    fn bh_create(&self, callback: LoopCallback<AioContext<L>>, lifetime: Lifetime) -> BottomHalf {
        let state = Arc::new(BhState::default());
        let id = self.bottom_halves.slots.borrow_mut().insert(BhSlot {
            state: state.clone(),
            callback: Rc::new(callback),
            oneshot: lifetime == Lifetime::Oneshot,
        });
        BottomHalf {
            id,
            state,
            shared: self.shared.clone(),
        }
    }

    /// Deletes a bottom half of this context (same as [`BottomHalf::delete`], but checks that
    /// the handle belongs here).
    pub fn bh_delete(&self, bh: &BottomHalf) -> Result<(), AioError> {
        if !Arc::ptr_eq(&bh.shared, &self.shared) || bh.state.is_deleted() {
            return Err(AioError::UnknownBottomHalf { id: bh.id() });
        }
        bh.delete();
        Ok(())
    }

    /// Whether a bottom half waits to run: a queued schedule that is still live. A cancelled
    /// one leaves a stale entry that must not cost an extra iteration (QEMU cancels its
    /// completion bottom half once every completion is processed; that must cost nothing).
    pub(super) fn bh_pending(&self) -> BhWait {
        let mut wait = BhWait::None;
        let mut look = |e: &BhEntry| {
            let live = e.ticket == DELETE_TICKET
                || self
                    .bottom_halves
                    .slots
                    .borrow()
                    .get(e.id)
                    .is_some_and(|s| s.state.is_pending(e.ticket));
            if live {
                wait = if e.idle { BhWait::Idle } else { BhWait::Now };
            }
            wait == BhWait::Now
        };
        let urgent = self.shared.bh_queue.any(&mut look);
        if !urgent {
            let slices = self.bottom_halves.slices.borrow();
            slices.iter().flatten().any(&mut look);
        }
        wait
    }

    /// Runs the bottom halves scheduled before this call; returns whether any ran.
    pub(super) fn bh_poll(&self) -> bool {
        let table = &self.bottom_halves;
        let queued = self.shared.bh_queue.take();
        let my_level = {
            let mut slices = table.slices.borrow_mut();
            slices.push(queued.into());
            slices.len()
        };
        let mut progress = false;
        loop {
            let entry = {
                let mut slices = table.slices.borrow_mut();
                let next = slices[..my_level].iter_mut().find_map(|s| s.pop_front());
                match next {
                    Some(e) => e,
                    None => break,
                }
            };
            progress |= self.bh_run_entry(entry);
        }
        table.slices.borrow_mut().truncate(my_level - 1);
        progress
    }

    fn bh_run_entry(&self, entry: BhEntry) -> bool {
        let (state, callback, oneshot) = {
            match self.bottom_halves.slots.borrow().get(entry.id) {
                Some(s) => (s.state.clone(), s.callback.clone(), s.oneshot),
                None => return false,
            }
        };
        if entry.ticket == DELETE_TICKET {
            if state.is_deleted() {
                self.bh_free_slot(entry.id);
            }
            return false;
        }
        if !state.is_pending(entry.ticket) {
            return false;
        }
        if callback.is_busy() {
            // Running further up the stack: keep the schedule for after it returns.
            self.bottom_halves.deferred.borrow_mut().push(entry);
            return false;
        }
        if !state.claim(entry.ticket) {
            return false;
        }
        if oneshot {
            self.bh_free_slot(entry.id);
        }
        self.count(|c| c.bh_runs += 1);
        callback.invoke(self);
        let deferred = std::mem::take(&mut *self.bottom_halves.deferred.borrow_mut());
        for e in deferred {
            self.shared.bh_queue.push(e);
        }
        true
    }

    fn bh_free_slot(&self, id: SlotId) {
        let old = self.bottom_halves.slots.borrow_mut().remove(id);
        // Dropped here, outside the borrow: the callback's captures may call into the context.
        drop(old);
    }
}
