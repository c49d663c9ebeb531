//! The loop's counters: what it did, as plain numbers.
//!
//! This module owns [`LoopCounters`] and how a snapshot is taken; the other files of the loop
//! only add to them (through `count`).

use std::io;
use std::sync::atomic::Ordering;

use super::AioContext;
use crate::event_loop::EventLoop;

/// Declares [`LoopCounters`] from one list of fields, so that its name table, its merge and
/// the struct cannot drift apart.
macro_rules! loop_counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// What the loop has done, as plain numbers: tests and the bench read these to see *why*
        /// a figure is what it is.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct LoopCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl LoopCounters {
            /// Every counter with its field name, in declaration order (for reports: JSON,
            /// CSV, logs).
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name)),*]
            }

            fn fields_mut(&mut self) -> Vec<(&'static str, &mut u64)> {
                vec![$((stringify!($name), &mut self.$name)),*]
            }
        }
    };
}

loop_counters! {
    /// Calls of `poll()`, nested ones included.
    iterations,
    /// Monitor waits with a non-zero timeout (the loop may have slept).
    blocking_waits,
    /// Monitor waits with a zero timeout.
    nonblocking_waits,
    /// Iterations that skipped the monitor entirely because busy polling found work and every
    /// handler is covered by polling.
    waits_skipped,
    /// Waits interrupted by a signal (`EINTR`) and retried.
    wait_retries,
    /// Waits that failed with another error (the iteration made no fd progress).
    wait_errors,
    /// Writes to the context notifier by `notify()` (only while the loop was, or was about to
    /// be, blocked: notify_me).
    notifier_writes,
    /// Calls of `notify()`, written or not.
    notify_calls,
    /// Busy-polling windows run.
    poll_attempts,
    /// Busy-polling windows that found an `io_poll` handler ready (or a notification).
    poll_hits,
    /// Time spent busy polling, in ns.
    busy_poll_ns,
    /// The current polling window, in ns.
    poll_ns,
    /// Handlers busy polling checks now.
    poll_set,
    /// Handlers busy polling does not cover now (no `io_poll`, idle, or closed); they are
    /// still served by the monitor.
    unpolled_handlers,
    /// Times a handler left the poll set because it was idle for the idle interval.
    poll_idle_removals,
    /// Times the polling window shrank (to 0 with the default `shrink`).
    poll_shrinks,
    /// Probes of a collapsed window ([`PollRule::Recovering`](crate::PollRule)): one busy
    /// poll of `poll_max_ns` while the window is 0.
    poll_probes,
    /// Probes that found the event, restoring the window to `poll_max_ns`.
    poll_probe_hits,
    /// Bottom-half callbacks run.
    bh_runs,
    /// Timer callbacks run.
    timer_runs,
    /// Handler callbacks run (`io_read`, `io_write`, `io_poll_ready`).
    handler_calls,
    /// Registered fds found closed (`POLLNVAL`) and taken out of the monitor.
    closed_fds,
    /// The deepest nesting of `poll()` seen (1 = no nesting).
    max_nesting,
}

/// Counters that describe a state (a gauge), not a count of events: merged by taking the
/// larger value.
const GAUGES: [&str; 2] = ["poll_ns", "max_nesting"];

impl LoopCounters {
    /// Adds another loop's counters to these, as for loops that ran side by side (a job's
    /// parallel clones): counts and handler totals add up; the polling window and the nesting
    /// depth keep the larger value.
    pub fn merge(&mut self, other: &LoopCounters) {
        for ((name, mine), (_, theirs)) in self.fields_mut().into_iter().zip(other.named()) {
            if GAUGES.contains(&name) {
                *mine = (*mine).max(theirs);
            } else {
                *mine += theirs;
            }
        }
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
