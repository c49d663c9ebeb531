//! One iteration of the loop (QEMU's `aio_poll`): the wait timeout, busy polling and its
//! adaptive window, the wait on the monitor with the notify_me handshake, and the dispatch order
//! (bottom halves, ready handlers, expired timers).
//!
//! This module owns the iteration and the polling parameters. The tables it walks belong to
//! `handlers`, `bottom_half` and `timers`; it issues fd-monitor calls only through the
//! [`EventLoop`] trait.

use std::io;
use std::rc::Rc;
use std::time::Duration;

use super::bottom_half::{BhWait, IDLE_BH_DELAY_NS};
use super::handlers::{FdHandler, LoopCallback};
use super::{AioContext, CONTEXT_NOTIFIER};
use crate::error::AioError;
use crate::event_loop::{Event, EventLoop, Token};
use crate::polling::{PollParams, PollWindow, Wait, WindowChange};

/// What busy polling (step 2) leaves for the wait and the window.
struct Polled {
    /// The wait's timeout: 0 when polling found work.
    timeout: Option<u64>,
    /// The window as this iteration used it.
    window: PollWindow,
    /// The iteration could have blocked (only such waits teach the window).
    would_block: bool,
    /// This iteration probed a collapsed window.
    probe: bool,
    /// An `io_poll` check found the event.
    polled_hit: bool,
}

/// Why a handler is dispatched.
#[derive(Debug, Clone, Copy)]
enum Report {
    /// Its `io_poll` check said ready (busy polling): `io_poll_ready` runs.
    Polled,
    /// The monitor reported the fd: `io_read` and/or `io_write` run.
    Monitor { readable: bool, writable: bool },
}

impl<L: EventLoop> AioContext<L> {
    /// Sets the adaptive polling parameters; takes effect in the next iteration. Turning
    /// polling on starts the window at 4 µs; turning it off (max 0) resets the window to 0.
    pub fn set_poll_params(&self, params: PollParams) {
        self.params.set(params);
        let mut window = self.window.get();
        window.reset(&params);
        self.window.set(window);
    }

    /// The current adaptive polling parameters.
    pub fn poll_params(&self) -> PollParams {
        self.params.get()
    }

    /// Sets how long a handler may stay inactive before it leaves the poll set (default 7 s).
    pub fn set_poll_idle_interval(&self, interval: Duration) {
        self.poll_idle_ns
            .set(u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The wait timeout: 0 with a bottom half pending, else until the earliest timer, at most
    /// 10 ms while an idle bottom half is pending, else infinite (`None`). In ns.
    pub(super) fn compute_timeout(&self) -> Option<u64> {
        let idle_cap = match self.bh_pending() {
            BhWait::Now => return Some(0),
            BhWait::Idle => Some(IDLE_BH_DELAY_NS),
            BhWait::None => None,
        };
        let timer = self
            .timers
            .borrow()
            .earliest_runnable()
            .map(|earliest| earliest.saturating_sub(self.now_ns()));
        match (timer, idle_cap) {
            (Some(t), Some(cap)) => Some(t.min(cap)),
            (t, cap) => t.or(cap),
        }
    }

    /// Runs one iteration: waits for events (if `blocking`, until one arrives), then runs the
    /// bottom halves scheduled so far, the ready fd handlers and the expired timers. Returns
    /// whether any callback other than the context's own notifier ran (QEMU's `aio_poll`).
    ///
    /// A monitor error other than `EINTR` (which is retried) ends the iteration without fd
    /// progress; it is counted and kept for [`AioContext::take_last_wait_error`]. Use
    /// [`AioContext::try_poll`] to get it as a value.
    pub fn poll(&self, blocking: bool) -> bool {
        match self.try_poll(blocking) {
            Ok(progress) => progress,
            Err(AioError::Wait { source, .. }) => {
                *self.last_wait_error.borrow_mut() = Some(source);
                false
            }
            Err(_) => false,
        }
    }

    /// [`AioContext::poll`] that returns a failing wait as [`AioError::Wait`]. Bottom halves
    /// and timers still run in an iteration whose wait failed.
    pub fn try_poll(&self, blocking: bool) -> Result<bool, AioError> {
        let depth = self.depth.get() + 1;
        self.depth.set(depth);
        self.count(|c| {
            c.iterations += 1;
            c.max_nesting = c.max_nesting.max(depth as u64);
        });
        let result = self.iterate(blocking);
        self.depth.set(depth - 1);
        result
    }

    /// One iteration, in the steps of ARCHITECTURE.md's "One loop iteration".
    fn iterate(&self, blocking: bool) -> Result<bool, AioError> {
        let mut events = self.event_buffers.borrow_mut().pop().unwrap_or_default();
        let mut poll_ready: Vec<Token> = Vec::new();
        let seq = self.dispatch_seq.get() + 1;
        self.dispatch_seq.set(seq);
        let start = self.now_ns();
        // 1. Timeout (and idle handlers out of the poll set).
        let timeout = self.iteration_timeout(blocking, start);
        // 2. Busy polling, and polling mode begun or ended.
        let polled = self.busy_poll(blocking, timeout, &mut poll_ready);
        // 3. Wait on the monitor, unless polling found work that covers every handler.
        let wait_result = self.wait_unless_covered(polled.timeout, &poll_ready, &mut events);
        let end = self.now_ns();
        if blocking {
            self.learn_window(&polled, end.saturating_sub(start));
        }
        // Accept the notification (QEMU's aio_notify_accept).
        if self.shared.wakeup.accept() {
            self.shared.notifier.test_and_clear();
        }
        // 4.-6. Bottom halves, handlers, timers (and the tasks they woke).
        let progress = self.dispatch_iteration(&mut poll_ready, &mut events, seq, end);
        self.event_buffers.borrow_mut().push(events);
        self.iteration_result(wait_result, progress)
    }

    /// Step 1: the wait timeout (0 when not blocking); with polling on, handlers idle for the
    /// idle interval leave the poll set.
    fn iteration_timeout(&self, blocking: bool, now: u64) -> Option<u64> {
        if !blocking {
            return Some(0);
        }
        if self.params.get().max_ns > 0 {
            let dropped = self.handlers.borrow_mut().drop_idle(now);
            if dropped > 0 {
                self.count(|c| c.poll_idle_removals += dropped as u64);
            }
        }
        self.compute_timeout()
    }

    /// Step 2: busy polling, only worth it when the loop would otherwise block; then polling
    /// mode ends unless polling found the work (`io_poll_end`, and a last `io_poll` check for
    /// work queued while notifications were off: if it finds some, the wait does not block).
    fn busy_poll(
        &self,
        blocking: bool,
        timeout: Option<u64>,
        poll_ready: &mut Vec<Token>,
    ) -> Polled {
        let mut window = self.window.get();
        // Only a wait that could block says anything about the device: an iteration that
        // cannot wait (a bottom half is pending) must not teach the window.
        let would_block = blocking && timeout != Some(0);
        let (poll_ns, probe) = if would_block {
            window.next_window(&self.params.get())
        } else {
            (window.ns(), false)
        };
        if probe {
            self.count(|c| c.poll_probes += 1);
        }
        let mut timeout = timeout;
        let mut polled_work = false;
        if would_block && poll_ns > 0 {
            let spin_ns = timeout.map_or(poll_ns, |t| t.min(poll_ns));
            self.poll_set_started(true, poll_ready);
            if self.run_poll_handlers(spin_ns, poll_ready) {
                timeout = Some(0);
                polled_work = true;
            }
        }
        // An io_poll check found the event (not a notification that ended polling).
        let polled_hit = !poll_ready.is_empty();
        if !polled_work && self.poll_set_started(false, poll_ready) {
            timeout = Some(0);
        }
        Polled {
            timeout,
            window,
            would_block,
            probe,
            polled_hit,
        }
    }

    /// Step 3: the wait, with the notify_me handshake around one that may block; skipped when
    /// polling found work and covers every handler.
    fn wait_unless_covered(
        &self,
        timeout: Option<u64>,
        poll_ready: &[Token],
        events: &mut Vec<Event>,
    ) -> Result<(), AioError> {
        let skip_wait = timeout == Some(0)
            && !poll_ready.is_empty()
            && self.handlers.borrow().all_covered_by_polling();
        if skip_wait {
            self.count(|c| c.waits_skipped += 1);
            return Ok(());
        }
        let armed = timeout != Some(0);
        let mut timeout = timeout;
        if armed {
            // A notification or a schedule that raced with the handshake: don't sleep.
            timeout = if self.shared.wakeup.block_begin() {
                Some(0)
            } else {
                self.compute_timeout()
            };
        }
        let result = self.wait(timeout, events);
        if armed {
            self.shared.wakeup.block_end();
        }
        result
    }

    /// The window learns from the iteration's block time (QEMU's rule, or the recovering one).
    fn learn_window(&self, polled: &Polled, block_ns: u64) {
        let params = self.params.get();
        let mut window = polled.window;
        let change = window.update(
            &params,
            Wait {
                block_ns,
                would_block: polled.would_block,
                probe: polled.probe,
                polled_hit: polled.polled_hit,
            },
        );
        self.window.set(window);
        match change {
            WindowChange::Shrank => self.count(|c| c.poll_shrinks += 1),
            WindowChange::ProbeHit => self.count(|c| c.poll_probe_hits += 1),
            _ => {}
        }
    }

    /// Steps 4 to 6: the bottom halves scheduled so far, the handlers polling and the monitor
    /// found, the expired timers, then the tasks they woke.
    fn dispatch_iteration(
        &self,
        poll_ready: &mut Vec<Token>,
        events: &mut Vec<Event>,
        seq: u64,
        now: u64,
    ) -> bool {
        let mut progress = self.bh_poll();
        for token in poll_ready.drain(..) {
            progress |= self.dispatch(token, Report::Polled, seq, now);
        }
        for ev in events.drain(..) {
            if ev.token == CONTEXT_NOTIFIER {
                // A notify() that saw notify_me just before it dropped wrote the eventfd after
                // we accepted `notified`: clear it here, or every later wait returns at once.
                self.shared.notifier.test_and_clear();
                continue;
            }
            if ev.invalid {
                progress |= self.handle_closed(ev.token, seq);
                continue;
            }
            let report = Report::Monitor {
                readable: ev.readable,
                writable: ev.writable,
            };
            progress |= self.dispatch(ev.token, report, seq, now);
        }
        progress |= self.run_timers();
        // Tasks woken by the handlers and timers above run now, not an iteration later.
        progress |= self.run_woken_tasks();
        progress
    }

    /// A failed wait in an iteration that did work is reported through the counters and the
    /// next call, not as this call's error.
    fn iteration_result(
        &self,
        wait: Result<(), AioError>,
        progress: bool,
    ) -> Result<bool, AioError> {
        wait.map(|()| progress).or_else(|e| {
            if progress {
                *self.last_wait_error.borrow_mut() = Some(match e {
                    AioError::Wait { source, .. } => source,
                    other => io::Error::from(other),
                });
                Ok(true)
            } else {
                Err(e)
            }
        })
    }

    fn wait(&self, timeout_ns: Option<u64>, events: &mut Vec<Event>) -> Result<(), AioError> {
        let deadline = timeout_ns.map(|t| self.now_ns().saturating_add(t));
        let mut timeout = timeout_ns;
        let mut monitor = self.monitor.borrow_mut();
        loop {
            self.count(|c| {
                if timeout == Some(0) {
                    c.nonblocking_waits += 1
                } else {
                    c.blocking_waits += 1
                }
            });
            match monitor.wait(timeout.map(Duration::from_nanos), events) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    self.count(|c| c.wait_retries += 1);
                    timeout = deadline.map(|d| d.saturating_sub(self.now_ns()));
                    if !events.is_empty() {
                        return Ok(());
                    }
                }
                Err(source) => {
                    self.count(|c| c.wait_errors += 1);
                    return Err(AioError::Wait {
                        monitor: monitor.name(),
                        source,
                    });
                }
            }
        }
    }

    /// Busy polling: calls the poll set's `io_poll` checks until one is ready, a notification
    /// arrives, or `window_ns` passes. Ready tokens go to `ready`. Returns whether to stop
    /// waiting.
    fn run_poll_handlers(&self, window_ns: u64, ready: &mut Vec<Token>) -> bool {
        let start = self.now_ns();
        // One snapshot per window: io_poll checks run no loop code, so the table cannot change
        // while we spin, and each pass is then an indirect call per handler, nothing more.
        let handlers: Vec<(Token, Rc<FdHandler<L>>)> = {
            let table = self.handlers.borrow();
            table
                .poll_set
                .iter()
                .filter_map(|&t| table.get(t).map(|slot| (t, slot.callbacks.clone())))
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
            return self.shared.wakeup.is_notified();
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
            std::hint::spin_loop();
        }
        let hit = found || self.shared.wakeup.is_notified();
        let spent = now.max(self.now_ns()).saturating_sub(start);
        self.count(|c| {
            c.poll_attempts += 1;
            c.busy_poll_ns += spent;
            if hit {
                c.poll_hits += 1;
            }
        });
        hit
    }

    /// Runs a handler's callbacks for one readiness report.
    fn dispatch(&self, token: Token, report: Report, seq: u64, now: u64) -> bool {
        let (readable, writable, poll_ready) = match report {
            Report::Polled => (true, false, true),
            Report::Monitor { readable, writable } => (readable, writable, false),
        };
        // Each direction is deduplicated on its own: a report older than the last dispatch
        // of that direction (`>= seq`: already run for this wait, or by a nested poll whose later
        // wait superseded this report) is dropped. Level-triggered fds lose nothing by that.
        let (run_read, run_write, callbacks) = {
            let mut table = self.handlers.borrow_mut();
            let Some(slot) = table.get_mut(token) else {
                return false;
            };
            if slot.closed {
                return false;
            }
            let run_read = (readable || poll_ready) && slot.last_read_dispatch < seq;
            let run_write = writable && slot.last_write_dispatch < seq;
            if run_read {
                slot.last_read_dispatch = seq;
            }
            if run_write {
                slot.last_write_dispatch = seq;
            }
            let callbacks = slot.callbacks.clone();
            if run_read {
                table.mark_active(token, now, self.poll_idle_ns.get());
            }
            (run_read, run_write, callbacks)
        };
        let mut progress = false;
        if run_read {
            // Found by polling: io_poll_ready; reported by the monitor: io_read. Each falls
            // back to the other when the handler has only one of them.
            let (first, second) = if poll_ready {
                (&callbacks.io_poll_ready, &callbacks.io_read)
            } else {
                (&callbacks.io_read, &callbacks.io_poll_ready)
            };
            progress |= self.call(first.as_ref().or(second.as_ref()));
        }
        if run_write && callbacks.io_write.is_some() {
            // The read callback may have removed or replaced the handler.
            let current = self
                .handlers
                .borrow()
                .get(token)
                .map(|s| s.callbacks.clone());
            if let Some(current) = current {
                progress |= self.call(current.io_write.as_ref());
            }
        }
        progress
    }

    fn call(&self, callback: Option<&LoopCallback<L>>) -> bool {
        let Some(cb) = callback else { return false };
        let ran = cb.invoke(self);
        if ran {
            self.count(|c| c.handler_calls += 1);
        }
        ran
    }

    /// An fd closed while registered: stop watching it (no busy loop) and let its handler see
    /// the condition once through `io_read` (its read fails with `EBADF`).
    fn handle_closed(&self, token: Token, seq: u64) -> bool {
        let fd = self.handlers.borrow_mut().mark_closed(token);
        let Some(fd) = fd else { return false };
        self.count(|c| c.closed_fds += 1);
        let _ = self.monitor.borrow_mut().forget_closed(fd);
        let callbacks = {
            let mut table = self.handlers.borrow_mut();
            let Some(slot) = table.get_mut(token) else {
                return false;
            };
            slot.last_read_dispatch = seq;
            slot.last_write_dispatch = seq;
            slot.callbacks.clone()
        };
        self.call(
            callbacks
                .io_read
                .as_ref()
                .or(callbacks.io_poll_ready.as_ref()),
        )
    }
}
