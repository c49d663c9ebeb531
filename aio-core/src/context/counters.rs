//! The loop's counters: what it did, as plain numbers.
//!
//! This module owns [`LoopCounters`] and how a snapshot is taken; the other files of the loop
//! only add to them (through `count`).

use std::io;
use std::sync::atomic::Ordering;

use super::AioContext;
use crate::event_loop::EventLoop;

/// What the loop has done, as plain numbers: tests and the bench read these to see *why* a
/// figure is what it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopCounters {
    /// Calls of `poll()`, nested ones included.
    pub iterations: u64,
    /// Monitor waits with a non-zero timeout (the loop may have slept).
    pub blocking_waits: u64,
    /// Monitor waits with a zero timeout.
    pub nonblocking_waits: u64,
    /// Iterations that skipped the monitor entirely because busy polling found work and every
    /// handler is covered by polling.
    pub waits_skipped: u64,
    /// Waits interrupted by a signal (`EINTR`) and retried.
    pub wait_retries: u64,
    /// Waits that failed with another error (the iteration made no fd progress).
    pub wait_errors: u64,
    /// Writes to the context notifier by `notify()` (only while the loop was, or was about to
    /// be, blocked: notify_me).
    pub notifier_writes: u64,
    /// Calls of `notify()`, written or not.
    pub notify_calls: u64,
    /// Busy-polling windows run.
    pub poll_attempts: u64,
    /// Busy-polling windows that found an `io_poll` handler ready (or a notification).
    pub poll_hits: u64,
    /// Time spent busy polling, in ns.
    pub busy_poll_ns: u64,
    /// The current polling window, in ns.
    pub poll_ns: u64,
    /// Handlers busy polling checks now.
    pub poll_set: u64,
    /// Handlers busy polling does not cover now (no `io_poll`, idle, or closed); they are
    /// still served by the monitor.
    pub unpolled_handlers: u64,
    /// Times a handler left the poll set because it was idle for the idle interval.
    pub poll_idle_removals: u64,
    /// Times the polling window shrank (to 0 with the default `shrink`).
    pub poll_shrinks: u64,
    /// Probes of a collapsed window ([`PollRule::Recovering`](crate::PollRule)): one busy
    /// poll of `poll_max_ns` while the window is 0.
    pub poll_probes: u64,
    /// Probes that found the event, restoring the window to `poll_max_ns`.
    pub poll_probe_hits: u64,
    /// Bottom-half callbacks run.
    pub bh_runs: u64,
    /// Timer callbacks run.
    pub timer_runs: u64,
    /// Handler callbacks run (`io_read`, `io_write`, `io_poll_ready`).
    pub handler_calls: u64,
    /// Registered fds found closed (`POLLNVAL`) and taken out of the monitor.
    pub closed_fds: u64,
    /// The deepest nesting of `poll()` seen (1 = no nesting).
    pub max_nesting: u64,
}

impl LoopCounters {
    /// Adds another loop's counters to these, as for loops that ran side by side (a job's
    /// parallel clones): counts and handler totals add up; the polling window and the nesting
    /// depth keep the larger value.
    pub fn merge(&mut self, other: &LoopCounters) {
        // Destructured so that a new field cannot be forgotten here.
        let LoopCounters {
            iterations,
            blocking_waits,
            nonblocking_waits,
            waits_skipped,
            wait_retries,
            wait_errors,
            notifier_writes,
            notify_calls,
            poll_attempts,
            poll_hits,
            busy_poll_ns,
            poll_ns,
            poll_set,
            unpolled_handlers,
            poll_idle_removals,
            poll_shrinks,
            poll_probes,
            poll_probe_hits,
            bh_runs,
            timer_runs,
            handler_calls,
            closed_fds,
            max_nesting,
        } = *other;
        self.iterations += iterations;
        self.blocking_waits += blocking_waits;
        self.nonblocking_waits += nonblocking_waits;
        self.waits_skipped += waits_skipped;
        self.wait_retries += wait_retries;
        self.wait_errors += wait_errors;
        self.notifier_writes += notifier_writes;
        self.notify_calls += notify_calls;
        self.poll_attempts += poll_attempts;
        self.poll_hits += poll_hits;
        self.busy_poll_ns += busy_poll_ns;
        self.poll_ns = self.poll_ns.max(poll_ns);
        self.poll_set += poll_set;
        self.unpolled_handlers += unpolled_handlers;
        self.poll_idle_removals += poll_idle_removals;
        self.poll_shrinks += poll_shrinks;
        self.poll_probes += poll_probes;
        self.poll_probe_hits += poll_probe_hits;
        self.bh_runs += bh_runs;
        self.timer_runs += timer_runs;
        self.handler_calls += handler_calls;
        self.closed_fds += closed_fds;
        self.max_nesting = self.max_nesting.max(max_nesting);
    }
}

impl<L: EventLoop> AioContext<L> {
    /// A snapshot of the counters.
    pub fn counters(&self) -> LoopCounters {
        let mut c = *self.counters.borrow();
        c.notifier_writes = self.shared.notifier_writes.load(Ordering::Relaxed);
        c.notify_calls = self.shared.notify_calls.load(Ordering::Relaxed);
        c.poll_ns = self.window.get().ns();
        let handlers = self.handlers.borrow();
        c.poll_set = handlers.poll_set.len() as u64;
        c.unpolled_handlers = handlers.unpolled() as u64;
        c
    }

    /// The last wait error other than `EINTR`, if the latest failing iteration had one.
    pub fn take_last_wait_error(&self) -> Option<io::Error> {
        self.last_wait_error.borrow_mut().take()
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut LoopCounters)) {
        f(&mut self.counters.borrow_mut());
    }
}
