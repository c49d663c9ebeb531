//! The loop's counters, the context's side: the snapshot [`AioContext::counters`], the last
//! wait error, and `count`, through which the other files of the loop add to them.
//!
//! This module owns how a snapshot is taken: the counts the loop added, with what is read at
//! that moment (the notifier's counts, the polling window, the poll set). The counters
//! themselves are `counters.rs`'s.

use std::io;
use std::sync::atomic::Ordering;

use super::counters::LoopCounters;
use crate::AioContext;
use aio_core::EventLoop;

impl<L: EventLoop> AioContext<L> {
    /// A snapshot of the counters.
    pub fn counters(&self) -> LoopCounters {
        let mut c = *self.counters.borrow();
        c.notifier_writes = self.shared.notifier_writes.load(Ordering::Relaxed);
        c.notify_calls = self.shared.notify_calls.load(Ordering::Relaxed);
        c.poll_ns = self.busy_poll.window_ns();
        self.busy_poll.auto_counters(&mut c);
        c.poll_set = self.busy_poll.set_len() as u64;
        c.unpolled_handlers = self
            .handlers
            .borrow()
            .len()
            .saturating_sub(c.poll_set as usize) as u64;
        c
    }

    /// The last wait error other than `EINTR`, if the latest failing iteration had one.
    pub fn take_last_wait_error(&self) -> Option<io::Error> {
        self.iteration.last_wait_error.borrow_mut().take()
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut LoopCounters)) {
        f(&mut self.counters.borrow_mut());
    }
}
