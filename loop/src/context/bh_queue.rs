//! The bottom-half queue: schedules on their way from any thread to the loop thread.
//!
//! This module owns [`BhQueue`] and its entries, never a bottom half's state or callback
//! (`bh_table.rs`) or the shared part of the context that holds the queue (`shared.rs`). It
//! is a leaf: both of those name it, it names neither.

use std::sync::{Mutex, PoisonError};

use aio_core::kit::SlotId;

/// The ticket value of a queue entry that asks the loop to free a deleted bottom half's slot.
pub(crate) const DELETE_TICKET: u64 = u64::MAX;

/// One schedule (or deletion) on its way to the loop thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BhEntry {
    pub(crate) id: SlotId,
    pub(crate) ticket: u64,
    /// Scheduled with `BottomHalf::schedule_idle`: it does not make the wait non-blocking.
    pub(crate) idle: bool,
}

/// The schedules (and deletions) on their way from any thread to the loop thread.
#[derive(Debug, Default)]
pub(crate) struct BhQueue(Mutex<Vec<BhEntry>>);

impl BhQueue {
    #[inline]
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<BhEntry>> {
        // A panic while the lock was held cannot leave a half-pushed entry behind.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Any thread: queues an entry for the loop.
    #[inline]
    pub(crate) fn push(&self, entry: BhEntry) {
        self.lock().push(entry);
    }

    /// Loop side: takes every queued entry, oldest first.
    #[inline]
    pub(super) fn take(&self) -> Vec<BhEntry> {
        std::mem::take(&mut *self.lock())
    }

    /// Whether `f` holds for a queued entry (it stops at the first).
    #[inline]
    pub(super) fn any(&self, f: impl FnMut(&BhEntry) -> bool) -> bool {
        self.lock().iter().any(f)
    }
}
