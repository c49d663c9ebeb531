//! Busy polling's state: what it remembers between iterations, and what one iteration's
//! polling leaves for its wait.
//!
//! This module owns [`BusyPoll`] (the polling parameters and window, the automatic rule's
//! model, the idle interval, the poll set, whether polling mode began) and [`Polled`]. It
//! never names the context: the spin, polling mode and the window's learning are
//! `busy_poll.rs`'s, the window arithmetic is `crate::polling`'s (pure functions of the
//! measured waits).

use std::cell::{Cell, RefCell};

use super::counters::LoopCounters;
use crate::polling::auto::{AutoWait, AutoWindow};
use crate::polling::{PollParams, PollWindow, DEFAULT_POLL_IDLE_NS};
use aio_core::Token;

/// What busy polling remembers between iterations.
pub(super) struct BusyPoll {
    pub(super) params: Cell<PollParams>,
    pub(super) window: Cell<PollWindow>,
    /// [`PollRule::Auto`](crate::PollRule::Auto)'s model, while that rule is set.
    pub(super) auto: RefCell<Option<AutoWindow>>,
    /// The last wait, until the model learns it: after the iteration's callbacks, so that the
    /// model's arithmetic does not delay the next request (a thread pool's worker that waits
    /// longer for it goes to sleep, and the next wait is a wake-up longer).
    pub(super) auto_pending: Cell<Option<AutoWait>>,
    /// How long a handler may stay inactive before it leaves the poll set.
    pub(super) idle_ns: Cell<u64>,
    /// The handlers busy polling checks: they have `io_poll`, are not idle and not closed.
    pub(super) set: RefCell<Vec<Member>>,
    /// Polling mode began and has not ended since (QEMU's `ctx->poll_started`): an iteration
    /// that did not poll has nothing to end otherwise.
    pub(super) mode_started: Cell<bool>,
}

/// One handler of the poll set.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) token: Token,
    /// Clock reading after which the handler leaves the set if it stays inactive.
    idle_deadline: u64,
}

/// What busy polling (step 2 of an iteration) leaves for the wait and the window.
pub(super) struct Polled {
    /// The wait's timeout: 0 when polling found work.
    pub(super) timeout: Option<u64>,
    /// The window as this iteration used it.
    pub(super) window: PollWindow,
    /// The iteration could have blocked (only such waits teach the window).
    pub(super) would_block: bool,
    /// This iteration probed a collapsed window.
    pub(super) probe: bool,
    /// An `io_poll` check found the event.
    pub(super) polled_hit: bool,
    /// How long the loop polled, in ns.
    pub(super) spun_ns: u64,
}

impl BusyPoll {
    /// Polling off, the default idle interval, an empty poll set.
    pub(super) fn new() -> Self {
        BusyPoll {
            params: Cell::new(PollParams::default()),
            window: Cell::new(PollWindow::default()),
            auto: RefCell::new(None),
            auto_pending: Cell::new(None),
            idle_ns: Cell::new(DEFAULT_POLL_IDLE_NS),
            set: RefCell::new(Vec::new()),
            mode_started: Cell::new(false),
        }
    }

    /// The current polling window in ns.
    pub(super) fn window_ns(&self) -> u64 {
        match &*self.auto.borrow() {
            Some(auto) => auto.chosen_ns().min(self.params.get().max_ns),
            None => self.window.get().ns(),
        }
    }

    /// [`PollRule::Auto`](crate::PollRule::Auto)'s decisions, into a counters snapshot.
    pub(super) fn auto_counters(&self, c: &mut LoopCounters) {
        if let Some(auto) = &*self.auto.borrow() {
            c.poll_auto_choices = auto.updates;
            c.poll_auto_off = auto.offs;
            c.poll_auto_budget_cuts = auto.budget_cuts;
            c.poll_wake_ns = auto.wake_ns();
            c.poll_followup_ns = auto.followup_ns();
        }
    }

    /// How many handlers the poll set holds.
    pub(super) fn set_len(&self) -> usize {
        self.set.borrow().len()
    }

    /// Whether `token`'s handler is in the poll set.
    #[cfg(test)]
    fn contains(&self, token: Token) -> bool {
        self.set.borrow().iter().any(|m| m.token == token)
    }

    /// A handler with an `io_poll` check came, was replaced or was active at `now`: it is in
    /// the set for another idle interval.
    pub(super) fn join(&self, token: Token, now: u64) {
        let idle_deadline = now.saturating_add(self.idle_ns.get());
        let mut set = self.set.borrow_mut();
        match set.iter_mut().find(|m| m.token == token) {
            Some(member) => member.idle_deadline = idle_deadline,
            None => set.push(Member {
                token,
                idle_deadline,
            }),
        }
    }

    /// A handler left: removed, closed, or replaced by one without `io_poll`.
    pub(super) fn leave(&self, token: Token) {
        self.set.borrow_mut().retain(|m| m.token != token);
    }

    /// With polling on, handlers inactive for the idle interval leave the set; returns
    /// their tokens (no allocation when none leaves).
    pub(super) fn drop_idle(&self, now: u64) -> Vec<Token> {
        let mut dropped = Vec::new();
        if self.params.get().max_ns == 0 {
            return dropped;
        }
        self.set.borrow_mut().retain(|m| {
            let stays = m.idle_deadline > now;
            if !stays {
                dropped.push(m.token);
            }
            stays
        });
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_leaves_at_the_exact_end_of_its_idle_interval() {
        let busy = BusyPoll::new();
        busy.params.set(PollParams::iothread());
        busy.idle_ns.set(1_000);
        busy.join(Token(7), 100);
        assert_eq!(busy.drop_idle(1_099), [], "still inside the interval");
        assert!(busy.contains(Token(7)) && !busy.contains(Token(8)));
        assert_eq!(
            busy.drop_idle(1_100),
            [Token(7)],
            "idle for the whole interval"
        );
        assert!(!busy.contains(Token(7)));
        // With polling off nothing is dropped (the set is not used).
        busy.join(Token(7), 100);
        busy.params.set(PollParams::default());
        assert_eq!(busy.drop_idle(u64::MAX), []);
    }
}
