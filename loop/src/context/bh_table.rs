//! Bottom halves' state: callbacks scheduled from any thread, run once per schedule on the
//! loop thread.
//!
//! This module owns the cross-thread schedule state of each bottom half, the [`BottomHalf`]
//! handle, and the loop side ([`BhTable`]: the slots with the callbacks, the schedules taken
//! off the queue (`bh_queue.rs`'s `BhQueue`, reached by other threads through the context's
//! shared part), and those kept for a callback running further up the stack). The callbacks
//! themselves never leave the loop thread: the [`BottomHalf`] handle that other threads hold
//! carries only an id and an atomic state. It never runs a callback and never names the
//! context (the table is generic over the callbacks' argument `C`): creating bottom halves on
//! the context and running them are `bottom_half.rs`'s.
//!
//! State word of a bottom half: bit 0 scheduled, bit 1 deleted, bits 2.. a ticket that grows with
//! every schedule. A queue entry names the ticket it was pushed for, so an entry left behind by a
//! `cancel()` can never run a later schedule early: that is what keeps "a bottom half scheduled
//! while bottom halves run goes to the next iteration" exact.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::bh_queue::{BhEntry, DELETE_TICKET};
use super::callback::LoopCallback;
use super::shared::Shared;
use crate::sync::AtomicU64;
use aio_core::kit::{SlotId, Slots};

const SCHEDULED: u64 = 1;
const DELETED: u64 = 2;
/// The pending schedule is idle ([`BottomHalf::schedule_idle`]).
const IDLE: u64 = 4;
const TICKET_SHIFT: u32 = 3;

/// What a schedule did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheduled {
    /// Newly scheduled under this ticket: queue an entry and wake the loop.
    New(u64),
    /// Already scheduled: nothing to do.
    Already,
    /// Was scheduled idle, is urgent now: queue an urgent entry for this ticket.
    Upgraded(u64),
}

/// How long an idle bottom half may wait for the loop (QEMU's `qemu_bh_schedule_idle`: the
/// wait timeout is at most 10 ms while one is pending).
pub const IDLE_BH_DELAY_NS: u64 = 10_000_000;

/// What bottom halves ask of the next wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BhWait {
    /// Nothing pending.
    None,
    /// Only idle bottom halves: wait at most [`IDLE_BH_DELAY_NS`].
    Idle,
    /// A bottom half waits to run: do not block.
    Now,
}

/// The state shared between a bottom half's handles and its slot on the loop thread.
#[derive(Debug)]
pub(crate) struct BhState {
    word: AtomicU64,
}

/// A schedule refused because the bottom half is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deleted;

impl Default for BhState {
    fn default() -> Self {
        BhState {
            word: AtomicU64::new(0),
        }
    }
}

impl BhState {
    /// Any side: schedules. `Ok(Some(ticket))`: newly scheduled, the caller queues an entry
    /// for `ticket` and wakes the loop; `Ok(None)`: already scheduled, nothing to do.
    #[cfg(aio_loom)]
    pub(crate) fn try_schedule(&self) -> Result<Option<u64>, Deleted> {
        self.try_schedule_as(false).map(|s| match s {
            Scheduled::New(ticket) => Some(ticket),
            Scheduled::Already | Scheduled::Upgraded(_) => None,
        })
    }

    /// Any side: schedules, idle or not; an urgent schedule of a bottom half scheduled idle
    /// makes it urgent ([`Scheduled::Upgraded`]).
    pub(crate) fn try_schedule_as(&self, idle: bool) -> Result<Scheduled, Deleted> {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if word & DELETED != 0 {
                return Err(Deleted);
            }
            let (new, result) = if word & SCHEDULED != 0 {
                if idle || word & IDLE == 0 {
                    return Ok(Scheduled::Already);
                }
                (word & !IDLE, Scheduled::Upgraded(word >> TICKET_SHIFT))
            } else {
                let ticket = (word >> TICKET_SHIFT) + 1;
                let idle_bit = if idle { IDLE } else { 0 };
                (
                    (ticket << TICKET_SHIFT) | SCHEDULED | idle_bit,
                    Scheduled::New(ticket),
                )
            };
            match self
                .word
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(result),
                Err(actual) => word = actual,
            }
        }
    }

    /// Any side: drops a pending schedule; returns whether one was pending.
    pub(crate) fn cancel(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        while word & SCHEDULED != 0 {
            match self.word.compare_exchange_weak(
                word,
                word & !(SCHEDULED | IDLE),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
        false
    }

    /// Whether a schedule is pending.
    pub(crate) fn is_scheduled(&self) -> bool {
        self.word.load(Ordering::Acquire) & SCHEDULED != 0
    }

    /// Any side: marks deleted; returns false if it already was.
    pub(crate) fn delete(&self) -> bool {
        self.word.fetch_or(DELETED, Ordering::AcqRel) & DELETED == 0
    }

    /// Loop side: claims the schedule named by `ticket`; true means "run it now".
    pub(crate) fn claim(&self, ticket: u64) -> bool {
        let scheduled = (ticket << TICKET_SHIFT) | SCHEDULED;
        let mut word = self.word.load(Ordering::Acquire);
        // Idle or not, the same schedule; an upgrade clearing IDLE meanwhile is retried.
        while word & !IDLE == scheduled {
            match self.word.compare_exchange_weak(
                word,
                ticket << TICKET_SHIFT,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
        false
    }

    /// Whether the schedule named by `ticket` is still pending (not cancelled, not run).
    pub(crate) fn is_pending(&self, ticket: u64) -> bool {
        self.word.load(Ordering::Acquire) & !IDLE == (ticket << TICKET_SHIFT) | SCHEDULED
    }

    /// Loop side, at context drop: no handle can schedule any more.
    pub(crate) fn mark_deleted(&self) {
        self.word.fetch_or(DELETED, Ordering::AcqRel);
    }

    pub(crate) fn is_deleted(&self) -> bool {
        self.word.load(Ordering::Acquire) & DELETED != 0
    }
}

/// A handle to a bottom half: `Send + Sync + Clone`, usable from any thread.
///
/// Created by [`AioContext::bh_new`](crate::AioContext::bh_new). Scheduling an already
/// scheduled bottom half does nothing (it runs once); each run consumes one schedule.
#[derive(Clone)]
pub struct BottomHalf {
    pub(crate) id: SlotId,
    pub(crate) state: Arc<BhState>,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for BottomHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BottomHalf")
            .field("id", &self.id())
            .field("scheduled", &self.is_scheduled())
            .finish()
    }
}

impl BottomHalf {
    /// A number that identifies this bottom half within its context (for error messages).
    pub fn id(&self) -> u64 {
        self.id.to_u64()
    }

    /// Schedules the bottom half to run in the loop's next iteration and wakes the loop.
    ///
    /// Returns false if it was deleted. Scheduling a bottom half that is already scheduled
    /// returns true and does not make it run twice (one scheduled idle becomes urgent).
    pub fn schedule(&self) -> bool {
        self.schedule_as(false)
    }

    /// Schedules the bottom half without hurrying the loop (QEMU's `qemu_bh_schedule_idle`):
    /// it runs in an iteration that happens anyway, and a loop with nothing else to do waits
    /// at most [`IDLE_BH_DELAY_NS`] (10 ms) for it instead of not waiting at all. For
    /// housekeeping that must happen soon but not now. Returns false if it was deleted.
    pub fn schedule_idle(&self) -> bool {
        self.schedule_as(true)
    }

    fn schedule_as(&self, idle: bool) -> bool {
        let ticket = match self.state.try_schedule_as(idle) {
            Err(Deleted) => return false,
            Ok(Scheduled::Already) => return true,
            // A second entry for the same ticket makes it urgent; whichever entry comes first
            // runs it, the other is then stale.
            Ok(Scheduled::Upgraded(ticket)) => ticket,
            Ok(Scheduled::New(ticket)) => ticket,
        };
        self.push(ticket, idle);
        // The loop thread recomputes its timeout (and sees the queue) before it blocks; only
        // other threads need to wake it, and an idle schedule only a loop that is blocked.
        if !self.shared.on_loop_thread() {
            if idle {
                self.shared.notify_if_blocked();
            } else {
                self.shared.notify();
            }
        }
        true
    }

    /// Cancels a pending schedule; returns whether one was pending. A bottom half that is
    /// already running finishes; it does not run again unless scheduled again.
    pub fn cancel(&self) -> bool {
        self.state.cancel()
    }

    /// Whether a schedule is pending.
    pub fn is_scheduled(&self) -> bool {
        self.state.is_scheduled()
    }

    /// Deletes the bottom half: a pending schedule is dropped, later schedules return false,
    /// and the loop frees the callback in its next iteration. Returns false if it was already
    /// deleted.
    pub fn delete(&self) -> bool {
        if !self.state.delete() {
            return false;
        }
        self.cancel();
        self.shared.bh_queue.push(BhEntry {
            id: self.id,
            ticket: DELETE_TICKET,
            idle: false,
        });
        true
    }

    fn push(&self, ticket: u64, idle: bool) {
        self.shared.bh_queue.push(BhEntry {
            id: self.id,
            ticket,
            idle,
        });
    }
}

/// A bottom half's slot on the loop thread: its callback never leaves this thread.
pub(super) struct BhSlot<C> {
    pub(super) state: Arc<BhState>,
    pub(super) callback: Rc<LoopCallback<C>>,
    pub(super) oneshot: bool,
}

/// The loop side of a context's bottom halves.
pub(super) struct BhTable<C> {
    pub(super) slots: RefCell<Slots<BhSlot<C>>>,
    /// Schedules taken off the queue, one slice per `poll()` on the stack; a nested poll
    /// drains the outer slices too, oldest first (QEMU's `bh_slice_list`).
    pub(super) slices: RefCell<Vec<VecDeque<BhEntry>>>,
    /// Schedules of bottom halves whose callback is running further up the stack.
    pub(super) deferred: RefCell<Vec<BhEntry>>,
}

impl<C> BhTable<C> {
    pub(super) fn new() -> Self {
        BhTable {
            slots: RefCell::new(Slots::new()),
            slices: RefCell::new(Vec::new()),
            deferred: RefCell::new(Vec::new()),
        }
    }

    /// How many `poll()` levels hold a slice now (0 outside `poll()`).
    #[cfg(test)]
    pub(super) fn slice_levels(&self) -> usize {
        self.slices.borrow().len()
    }

    /// At context drop: every handle stops scheduling.
    pub(super) fn mark_all_deleted(&mut self) {
        for slot in self.slots.get_mut().values_mut() {
            slot.state.mark_deleted();
        }
    }
}
