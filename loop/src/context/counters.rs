//! The loop's counters: what it did, as plain numbers.
//!
//! This module owns [`LoopCounters`]: its fields, their names and how two merge. It never
//! names the context: how a snapshot is taken, and `count`, through which the other files of
//! the loop add to them, are `counting.rs`'s.

/// Declares [`LoopCounters`] from one list of fields, each a `count` (events, summed by a
/// merge) or a `gauge` (a state, merged by taking the larger value), so that its name table,
/// its merge and the struct cannot drift apart.
macro_rules! loop_counters {
    ($($(#[$doc:meta])* $kind:ident $name:ident,)*) => {
        /// What the loop has done, as plain numbers: tests and the bench read these to see *why*
        /// a figure is what it is. `#[non_exhaustive]`: new counters come without a breaking
        /// change; start from [`LoopCounters::default`] to build one.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct LoopCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl LoopCounters {
            /// Every counter with its field name, in declaration order (for reports: JSON,
            /// CSV, logs).
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name)),*]
            }

            /// Adds another loop's counters to these, as for loops that ran side by side (a
            /// job's parallel clones): counts and handler totals add up; the gauges (the
            /// polling window, the nesting depth) keep the larger value.
            pub fn merge(&mut self, other: &LoopCounters) {
                $(loop_counters!(@merge $kind, self.$name, other.$name);)*
            }
        }
    };
    (@merge count, $mine:expr, $theirs:expr) => { $mine += $theirs };
    (@merge gauge, $mine:expr, $theirs:expr) => { $mine = $mine.max($theirs) };
}

loop_counters! {
    /// Calls of `poll()`, nested ones included.
    count iterations,
    /// Monitor waits with a non-zero timeout (the loop may have slept).
    count blocking_waits,
    /// Monitor waits with a zero timeout.
    count nonblocking_waits,
    /// Iterations that skipped the monitor entirely because busy polling found work and every
    /// handler is covered by polling.
    count waits_skipped,
    /// Waits interrupted by a signal (`EINTR`) and retried.
    count wait_retries,
    /// Waits that failed with another error (the iteration made no fd progress).
    count wait_errors,
    /// Writes to the context notifier by `notify()` (only while the loop was, or was about to
    /// be, blocked: notify_me).
    count notifier_writes,
    /// Calls of `notify()`, written or not.
    count notify_calls,
    /// Busy-polling windows run.
    count poll_attempts,
    /// Busy-polling windows that found an `io_poll` handler ready (or a notification).
    count poll_hits,
    /// Time spent busy polling, in ns.
    count busy_poll_ns,
    /// The current polling window, in ns.
    gauge poll_ns,
    /// Handlers busy polling checks now.
    count poll_set,
    /// Handlers busy polling does not cover now (no `io_poll`, idle, or closed); they are
    /// still served by the monitor.
    count unpolled_handlers,
    /// Times a handler left the poll set because it was idle for the idle interval.
    count poll_idle_removals,
    /// Times the polling window shrank (to 0 with the default `shrink`).
    count poll_shrinks,
    /// Probes of a collapsed window ([`PollRule::Recovering`](crate::PollRule)): one busy
    /// poll of `poll_max_ns` while the window is 0.
    count poll_probes,
    /// Probes that found the event, restoring the window to `poll_max_ns`.
    count poll_probe_hits,
    /// Bottom-half callbacks run.
    count bh_runs,
    /// Timer callbacks run.
    count timer_runs,
    /// Handler callbacks run (`io_read`, `io_write`, `io_poll_ready`).
    count handler_calls,
    /// Registered fds found closed (`POLLNVAL`) and taken out of the monitor.
    count closed_fds,
    /// The deepest nesting of `poll()` seen (1 = no nesting).
    gauge max_nesting,
    /// Time spent busy polling that found nothing (the window ran out), in ns.
    count busy_poll_missed_ns,
    /// Busy-polling windows not begun because the monitor already held events or polls to
    /// arm ([`EventLoop::needs_wait`](aio_core::EventLoop::needs_wait)).
    count poll_skips_for_wait,
    /// Busy-polling windows cut short because the monitor came to hold events meanwhile (an
    /// fd outside the poll set became ready).
    count poll_cuts_for_wait,
    /// [`PollRule::Auto`](crate::PollRule::Auto): windows chosen from the waits seen.
    count poll_auto_choices,
    /// [`PollRule::Auto`](crate::PollRule::Auto): choices that turned polling off (the waits
    /// were too long for polling to pay).
    count poll_auto_off,
    /// [`PollRule::Auto`](crate::PollRule::Auto): windows cut because polling without hits
    /// had used its share of the time (to what the budget holds, or, below the median wait,
    /// not polled).
    count poll_auto_budget_cuts,
    /// [`PollRule::Auto`](crate::PollRule::Auto): the wake-up cost it weighs polling
    /// against, in ns (the wake-up's latency and the sleep's own CPU, priced).
    gauge poll_wake_ns,
    /// [`PollRule::Auto`](crate::PollRule::Auto): how much longer the median wait is after one
    /// the loop slept through than after a hit, in ns, added to what a miss costs (a thread
    /// pool whose worker fell asleep too; 0 where the device does not care).
    gauge poll_followup_ns,
}
