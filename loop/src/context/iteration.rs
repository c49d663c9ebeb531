//! One iteration of the loop (QEMU's `aio_poll`): the wait timeout, the wait on the monitor
//! with the notify_me handshake, and the dispatch order (bottom halves, ready handlers, expired
//! timers).
//!
//! This module owns the order of an iteration's steps; what iterations share (nesting depth,
//! dispatch sequence, event buffers, the last wait error) is `iteration_state.rs`'s. Busy
//! polling is `busy_poll`'s; the tables it walks belong to `handler_table`, `bh_table` and
//! `timer_table`; it issues fd-monitor calls only through the [`EventLoop`] trait.

use std::io;
use std::time::Duration;

use super::bh_table::{BhWait, IDLE_BH_DELAY_NS};
use super::callback::LoopCallback;
use super::shared::CONTEXT_NOTIFIER;
use crate::AioContext;
use aio_core::AioError;
use aio_core::{Event, EventLoop, Token};

/// How long, at most, polling that keeps finding work may skip the monitor's wait while some
/// handlers are outside the poll set (idle ones that left it, or ones without an `io_poll`
/// check): at most this long after the last wait, those handlers are looked at again. (A
/// handler waiting for writability, which only the monitor reports, makes every iteration
/// wait.)
///
/// QEMU skips the wait whenever polling made progress (`fdmon_ops->need_wait`), with no bound;
/// a bound keeps a handler outside the poll set from waiting as long as its neighbours stay
/// busy. 100 µs is a few iterations at the rates polling serves (QEMU's default polling window
/// is 32 µs), so the wait's system call is paid about once per 100 µs instead of once per
/// iteration.
pub(crate) const WAIT_SKIP_BOUND_NS: u64 = 100_000;

/// Why a handler is dispatched.
#[derive(Debug, Clone, Copy)]
enum Report {
    /// Its `io_poll` check said ready (busy polling): `io_poll_ready` runs.
    Polled,
    /// The monitor reported the fd: `io_read` and/or `io_write` run.
    Monitor { readable: bool, writable: bool },
}

impl<L: EventLoop> AioContext<L> {
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
                *self.iteration.last_wait_error.borrow_mut() = Some(source);
                false
            }
            Err(_) => false,
        }
    }

    /// [`AioContext::poll`] that returns a failing wait as [`AioError::Wait`]. Bottom halves
    /// and timers still run in an iteration whose wait failed.
    pub fn try_poll(&self, blocking: bool) -> Result<bool, AioError> {
        let depth = self.iteration.depth.get() + 1;
        self.iteration.depth.set(depth);
        self.count(|c| {
            c.iterations += 1;
            c.max_nesting = c.max_nesting.max(depth as u64);
        });
        let result = self.iterate(blocking);
        self.iteration.depth.set(depth - 1);
        result
    }

    /// One iteration, in the steps of ARCHITECTURE.md's "One loop iteration".
    fn iterate(&self, blocking: bool) -> Result<bool, AioError> {
        let mut events = self
            .iteration
            .event_buffers
            .borrow_mut()
            .pop()
            .unwrap_or_default();
        let mut poll_ready: Vec<Token> = Vec::new();
        let seq = self.iteration.dispatch_seq.get() + 1;
        self.iteration.dispatch_seq.set(seq);
        let start = self.now_ns();
        // 1. Timeout (and idle handlers out of the poll set).
        let timeout = self.iteration_timeout(blocking, start);
        // 2. Busy polling, and polling mode begun or ended.
        let polled = self.busy_poll(blocking, timeout, start, &mut poll_ready);
        // 3. Wait on the monitor, unless polling found work that covers every handler.
        let wait_result = self.wait_unless_covered(polled.timeout, &poll_ready, &mut events);
        let end = self.now_ns();
        if blocking {
            self.learn_window(&polled, end.saturating_sub(start), end);
        }
        // Accept the notification (QEMU's aio_notify_accept).
        if self.shared.wakeup.accept() {
            self.shared.notifier.test_and_clear();
        }
        // 4.-6. Bottom halves, handlers, timers (and the tasks they woke).
        let progress = self.dispatch_iteration(&mut poll_ready, &mut events, seq, end);
        // 7. The automatic window learns the wait, now that the next requests are out.
        self.learn_deferred();
        self.iteration.event_buffers.borrow_mut().push(events);
        self.iteration_result(wait_result, progress)
    }

    /// Step 1: the wait timeout (0 when not blocking); with polling on, handlers idle for the
    /// idle interval leave the poll set.
    fn iteration_timeout(&self, blocking: bool, now: u64) -> Option<u64> {
        if !blocking {
            return Some(0);
        }
        self.drop_idle_pollers(now);
        self.compute_timeout()
    }

    /// Step 3: the wait, with the notify_me handshake around one that may block; skipped when
    /// polling found work and covers every handler, or, when some handler is outside the poll
    /// set, for at most [`WAIT_SKIP_BOUND_NS`] after the last wait (QEMU's `need_wait`,
    /// bounded); never with a handler waiting for writability.
    fn wait_unless_covered(
        &self,
        timeout: Option<u64>,
        poll_ready: &[Token],
        events: &mut Vec<Event>,
    ) -> Result<(), AioError> {
        let skip_wait =
            timeout == Some(0) && !poll_ready.is_empty() && self.polling_may_skip_wait();
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
                *self.iteration.last_wait_error.borrow_mut() = Some(match e {
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
        let now = self.now_ns();
        self.iteration.last_wait_ns.set(now);
        let deadline = timeout_ns.map(|t| now.saturating_add(t));
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
            // Not closed (checked above): pollable when it has an io_poll check.
            if run_read && callbacks.io_poll.is_some() {
                // Activity: the handler (re)joins the poll set for another idle interval.
                self.busy_poll.join(token, now);
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

    /// Whether work found by polling may skip this iteration's wait: no handler waits for
    /// writability (which only the monitor reports), and every handler is in the poll set or
    /// the last wait was less than [`WAIT_SKIP_BOUND_NS`] ago.
    fn polling_may_skip_wait(&self) -> bool {
        let handlers = self.handlers.borrow();
        if handlers.has_writers() {
            return false;
        }
        self.busy_poll.set_len() == handlers.len()
            || self
                .now_ns()
                .saturating_sub(self.iteration.last_wait_ns.get())
                < WAIT_SKIP_BOUND_NS
    }

    fn call(&self, callback: Option<&LoopCallback<AioContext<L>>>) -> bool {
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
        self.busy_poll.leave(token);
        if let Some(slot) = self.handlers.borrow().get(token) {
            slot.callbacks.end_polling(false);
        }
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
