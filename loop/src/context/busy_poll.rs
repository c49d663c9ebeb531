//! Busy polling (QEMU's `try_poll_mode` and `poll_set_started`): the polling parameters and
//! window, the poll set with its idle handling, polling mode (`io_poll_begin` / `io_poll_end`),
//! and the spin over the `io_poll` checks.
//!
//! This module owns what busy polling does on the context, in each iteration and when its
//! parameters are set; what it remembers between iterations (`BusyPoll`) is `poll_state.rs`'s.
//! It never owns the window arithmetic (`crate::polling`, pure functions of the measured
//! waits) or the handlers' callbacks (`handlers.rs`, which tells it when a handler with an
//! `io_poll` check comes, goes or is active).

use std::rc::Rc;
use std::time::Duration;

use super::handler_table::HandlerCallbacks;
use super::poll_state::Polled;
use crate::polling::auto::{AutoWait, AutoWindow};
use crate::polling::{wake, PollParams, PollRule, Wait, WindowChange};
use crate::AioContext;
use aio_core::{EventLoop, Token};

impl<L: EventLoop> AioContext<L> {
    /// Sets the adaptive polling parameters; takes effect in the next iteration. Turning
    /// polling on starts the window at 4 µs; turning it off (max 0) resets the window to 0.
    pub fn set_poll_params(&self, params: PollParams) {
        let busy = &self.busy_poll;
        busy.params.set(params);
        let mut window = busy.window.get();
        window.reset(&params);
        busy.window.set(window);
        let mut auto = busy.auto.borrow_mut();
        busy.auto_pending.set(None);
        match params.rule {
            PollRule::Auto if params.max_ns > 0 => {
                let wake_ns = match params.wake_ns {
                    0 => wake::wake_cost().price_ns(),
                    given => given,
                };
                // A model already running keeps what it learned; a new wake-up cost starts
                // it afresh.
                if auto.as_ref().is_none_or(|a| a.wake_ns() != wake_ns) {
                    *auto = Some(AutoWindow::new(wake_ns));
                }
            }
            _ => *auto = None,
        }
    }

    /// The current adaptive polling parameters.
    pub fn poll_params(&self) -> PollParams {
        self.busy_poll.params.get()
    }

    /// Sets how long a handler may stay inactive before it leaves the poll set (default 7 s).
    pub fn set_poll_idle_interval(&self, interval: Duration) {
        self.busy_poll
            .idle_ns
            .set(u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Handlers idle for the idle interval leave the poll set (step 1 of an iteration), and
    /// polling mode ends for each as it leaves (`io_poll_end`, then a last `io_poll` check),
    /// as QEMU's `remove_idle_poll_handlers` does: so that beginning polling mode costs the
    /// poll set's size, not the number of handlers registered. One whose last check finds
    /// work was not idle after all: it stays, polling mode on again.
    pub(super) fn drop_idle_pollers(&self, now: u64) {
        let dropped = self.busy_poll.drop_idle(now);
        if dropped.is_empty() {
            return;
        }
        let mut left = 0;
        for token in dropped {
            let handler = self
                .handlers
                .borrow()
                .get(token)
                .map(|s| s.callbacks.clone());
            match handler {
                Some(h) if h.end_polling(true) => {
                    h.begin_polling();
                    self.busy_poll.join(token, now);
                }
                _ => left += 1,
            }
        }
        self.count(|c| c.poll_idle_removals += left);
    }

    /// Step 2 of an iteration: busy polling, only worth it when the loop would otherwise
    /// block; then polling mode ends unless polling found the work (`io_poll_end`, and a last
    /// `io_poll` check for work queued while notifications were off: if it finds some, the
    /// wait does not block). `now` is the iteration's start.
    pub(super) fn busy_poll(
        &self,
        blocking: bool,
        timeout: Option<u64>,
        now: u64,
        poll_ready: &mut Vec<Token>,
    ) -> Polled {
        let busy = &self.busy_poll;
        let mut window = busy.window.get();
        // Only a wait that could block says anything about the device: an iteration that
        // cannot wait (a bottom half is pending) must not teach the window.
        let would_block = blocking && timeout != Some(0);
        let params = busy.params.get();
        self.learn_deferred();
        let (poll_ns, probe) = match &mut *busy.auto.borrow_mut() {
            Some(auto) if would_block => (auto.next_window(now, params.max_ns), false),
            Some(_) => (0, false),
            None if would_block => window.next_window(&params),
            None => (window.ns(), false),
        };
        if probe {
            self.count(|c| c.poll_probes += 1);
        }
        let mut timeout = timeout;
        let mut polled_work = false;
        let mut spun_ns = 0;
        if would_block && poll_ns > 0 {
            // The monitor already holds what the wait would deliver (QEMU's `need_wait`): no
            // window, whose checks cannot see it; one pass of the checks (in polling mode, as
            // any window's) still looks at what only they can see.
            let spin_ns = if self.monitor_needs_wait() {
                self.count(|c| c.poll_skips_for_wait += 1);
                0
            } else {
                timeout.map_or(poll_ns, |t| t.min(poll_ns))
            };
            self.begin_poll_mode();
            let (hit, spent) = self.run_poll_handlers(spin_ns, poll_ready);
            spun_ns = spent;
            if hit {
                timeout = Some(0);
                polled_work = true;
            }
        }
        // An io_poll check found the event (not a notification that ended polling).
        let polled_hit = !poll_ready.is_empty();
        if !polled_work && self.end_poll_mode(poll_ready) {
            timeout = Some(0);
        }
        Polled {
            timeout,
            window,
            would_block,
            probe,
            polled_hit,
            spun_ns,
        }
    }

    /// The window learns from the iteration's block time, which ended at `end` (QEMU's rule,
    /// the recovering one, or the automatic one, which learns it in [`Self::learn_deferred`]).
    pub(super) fn learn_window(&self, polled: &Polled, block_ns: u64, end: u64) {
        let busy = &self.busy_poll;
        if busy.auto.borrow().is_some() {
            if polled.would_block {
                busy.auto_pending.set(Some(AutoWait {
                    block_ns,
                    polled_ns: polled.spun_ns,
                    hit: polled.polled_hit,
                    now_ns: end,
                }));
            }
            return;
        }
        let mut window = polled.window;
        let change = window.update(
            &busy.params.get(),
            Wait {
                block_ns,
                would_block: polled.would_block,
                probe: polled.probe,
                polled_hit: polled.polled_hit,
            },
        );
        busy.window.set(window);
        match change {
            WindowChange::Shrank => self.count(|c| c.poll_shrinks += 1),
            WindowChange::ProbeHit => self.count(|c| c.poll_probe_hits += 1),
            _ => {}
        }
    }

    /// [`PollRule::Auto`]'s model learns the last wait, if it has not yet: at the end of the
    /// iteration (after its callbacks), or at the next one's busy polling (a nested one's).
    pub(super) fn learn_deferred(&self) {
        let busy = &self.busy_poll;
        if let Some(wait) = busy.auto_pending.take() {
            if let Some(auto) = &mut *busy.auto.borrow_mut() {
                auto.observe(wait, busy.params.get().max_ns);
            }
        }
    }

    /// The poll set's handlers with polling-mode hooks, as a snapshot: the hooks run user code,
    /// so no table is borrowed while they run. Only the poll set is walked: a handler leaves
    /// polling mode as it leaves the set, so one outside it is never in polling mode. Empty,
    /// with no allocation, when no handler has hooks.
    fn hooked_pollers(&self) -> Vec<(Token, Rc<HandlerCallbacks<AioContext<L>>>)> {
        let table = self.handlers.borrow();
        if table.hooked_count() == 0 {
            return Vec::new();
        }
        let set = self.busy_poll.set.borrow();
        set.iter()
            .filter_map(|m| {
                let slot = table.get(m.token)?;
                slot.callbacks
                    .has_poll_hooks()
                    .then(|| (m.token, slot.callbacks.clone()))
            })
            .collect()
    }

    /// Begins polling mode for the poll set's hooked handlers: a walk of the poll set, not of
    /// every handler registered.
    fn begin_poll_mode(&self) {
        self.busy_poll.mode_started.set(true);
        for (_, handler) in self.hooked_pollers() {
            handler.begin_polling();
        }
    }

    /// Ends polling mode for every handler in it; tokens whose last check after
    /// `io_poll_end` found work go to `ready`. Returns whether there were any.
    fn end_poll_mode(&self, ready: &mut Vec<Token>) -> bool {
        // Every handler in polling mode began in `begin_poll_mode` since the last end: without
        // one, ending has nothing to do (the common iteration: no table scan, no allocation).
        if !self.busy_poll.mode_started.replace(false) {
            return false;
        }
        let mut found = false;
        for (token, handler) in self.hooked_pollers() {
            if handler.end_polling(true) {
                ready.push(token);
                found = true;
            }
        }
        found
    }

    /// Whether the monitor says a wait would find events now ([`EventLoop::needs_wait`]);
    /// `false` while it is borrowed (a wait further up the stack).
    fn monitor_needs_wait(&self) -> bool {
        self.monitor.try_borrow().is_ok_and(|m| m.needs_wait())
    }

    /// The spin: calls the poll set's `io_poll` checks until one is ready, a notification
    /// arrives, the monitor holds events, or `window_ns` passes (0: one pass). Ready tokens
    /// go to `ready`. Returns whether to stop waiting, and how long it spun in ns.
    fn run_poll_handlers(&self, window_ns: u64, ready: &mut Vec<Token>) -> (bool, u64) {
        let start = self.now_ns();
        // One snapshot per window: io_poll checks run no loop code, so the table cannot change
        // while we spin, and each pass is then an indirect call per handler, nothing more.
        let handlers: Vec<(Token, Rc<HandlerCallbacks<AioContext<L>>>)> = {
            let table = self.handlers.borrow();
            let set = self.busy_poll.set.borrow();
            set.iter()
                .filter_map(|m| {
                    table
                        .get(m.token)
                        .map(|slot| (m.token, slot.callbacks.clone()))
                })
                .filter(|(_, cbs)| {
                    // A handler whose callback is running further up the stack cannot be
                    // dispatched now; reporting it ready would only make a nested poll spin.
                    let ready_cb = cbs.io_poll_ready.as_ref().or(cbs.io_read.as_ref());
                    cbs.io_poll.is_some() && !ready_cb.is_some_and(|cb| cb.is_busy())
                })
                .collect()
        };
        if handlers.is_empty() {
            // Nothing to poll: spinning would only check for notifications the wait sees too.
            return (self.shared.wakeup.is_notified(), 0);
        }
        let mut found = false;
        let mut now = start;
        loop {
            for (token, cbs) in &handlers {
                let Some(io_poll) = &cbs.io_poll else {
                    continue;
                };
                let Ok(mut f) = io_poll.try_borrow_mut() else {
                    continue;
                };
                if f() {
                    ready.push(*token);
                    found = true;
                }
            }
            if found || self.shared.wakeup.is_notified() {
                break;
            }
            now = self.now_ns();
            if now.saturating_sub(start) >= window_ns {
                break;
            }
            if self.monitor_needs_wait() {
                // An fd the poll set does not cover is ready (a socket, say): the wait
                // delivers it now, not when the window runs out.
                self.count(|c| c.poll_cuts_for_wait += 1);
                break;
            }
            std::hint::spin_loop();
        }
        let hit = found || self.shared.wakeup.is_notified();
        let spent = now.max(self.now_ns()).saturating_sub(start);
        self.count(|c| {
            c.poll_attempts += 1;
            c.busy_poll_ns += spent;
            if hit {
                c.poll_hits += 1;
            } else {
                c.busy_poll_missed_ns += spent;
            }
        });
        (hit, spent)
    }
}
