//! Fault injection: an [`IoEngine`] wrapper that fails, loses, delays and reorders requests on
//! purpose, so tests can show that the loop and its users survive them.
//!
//! This module owns the faults only. It never changes what the wrapped engine does with the
//! requests it is given: a faulted request simply never reaches it, and held completions are
//! the wrapped engine's own, handed on later or in another order.
//!
//! ```
//! use aio_conformance::faults::{FaultPlan, FaultyEngine};
//! # fn wrap<E: aio_core::engine::IoEngine>(engine: E) -> FaultyEngine<E> {
//! // Every 5th request fails with EIO, completions are held 1 ms and handed on reversed.
//! let plan = FaultPlan {
//!     fail_every: Some((5, libc::EIO)),
//!     delay: std::time::Duration::from_millis(1),
//!     reorder: true,
//!     ..FaultPlan::default()
//! };
//! FaultyEngine::new(engine, plan).expect("the delay alarm thread")
//! # }
//! ```

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aio_core::engine::{Completion, IoEngine, Request, SubmitError};
use aio_core::Notifier;

/// Which faults to inject. The default injects none.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Fail every `n`th request submitted (counting from 1) with this errno.
    pub fail_every: Option<(u64, i32)>,
    /// Fail the requests with these tokens with these errnos.
    pub fail_tokens: Vec<(u64, i32)>,
    /// Acknowledge every `n`th write as done without doing it: a lost write, which only a
    /// verifier of the data can notice.
    pub lose_write_every: Option<u64>,
    /// Hold every completion back for at least this long.
    pub delay: Duration,
    /// Hand each batch of completions on in reverse order.
    pub reorder: bool,
}

/// What the wrapper did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Requests given to the wrapped engine.
    pub forwarded: u64,
    /// Requests failed on purpose.
    pub failed: u64,
    /// Writes acknowledged without being done.
    pub lost_writes: u64,
    /// Completions held back by `delay`.
    pub delayed: u64,
    /// Batches of two or more completions handed on reversed.
    pub reordered_batches: u64,
}

/// A thread that sets the wrapped engine's notifier when held completions fall due, so a loop
/// blocked in its wait comes back for them.
struct Alarm {
    deadlines: Option<mpsc::Sender<Instant>>,
    thread: Option<JoinHandle<()>>,
}

impl Alarm {
    fn new(notifier: Notifier) -> io::Result<Alarm> {
        let (tx, rx) = mpsc::channel::<Instant>();
        let thread = std::thread::Builder::new()
            .name("fault-alarm".into())
            .spawn(move || {
                while let Ok(at) = rx.recv() {
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    let _ = notifier.notify();
                }
            })?;
        Ok(Alarm {
            deadlines: Some(tx),
            thread: Some(thread),
        })
    }

    fn ring_at(&self, at: Instant) {
        if let Some(tx) = &self.deadlines {
            let _ = tx.send(at);
        }
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.deadlines = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An engine that injects the faults of a [`FaultPlan`] into another.
pub struct FaultyEngine<E: IoEngine> {
    inner: E,
    plan: FaultPlan,
    submitted: u64,
    writes: u64,
    /// Completions not handed on yet, each with the time it may go.
    held: VecDeque<(Instant, Completion)>,
    scratch: VecDeque<Completion>,
    stats: Rc<Cell<FaultStats>>,
    alarm: Alarm,
}

impl<E: IoEngine> FaultyEngine<E> {
    /// Wraps `inner`. Fails only if the alarm thread (which wakes the loop for delayed
    /// completions) or its copy of the notifier cannot be made.
    pub fn new(inner: E, plan: FaultPlan) -> io::Result<Self> {
        let alarm = Alarm::new(inner.notifier().try_clone()?)?;
        Ok(FaultyEngine {
            inner,
            plan,
            submitted: 0,
            writes: 0,
            held: VecDeque::new(),
            scratch: VecDeque::new(),
            stats: Rc::default(),
            alarm,
        })
    }

    /// What was injected so far.
    pub fn stats(&self) -> FaultStats {
        self.stats.get()
    }

    /// A handle that reads the stats after the engine has been moved away (e.g. into a
    /// context, or into code that drops it).
    pub fn stats_handle(&self) -> Rc<Cell<FaultStats>> {
        self.stats.clone()
    }

    fn count(&self, f: impl FnOnce(&mut FaultStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// The wrapped engine.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// Holds `c` until its delay is over (or hands it on at once without a delay).
    fn hold(&mut self, c: Completion) {
        let at = Instant::now() + self.plan.delay;
        if !self.plan.delay.is_zero() {
            self.count(|s| s.delayed += 1);
            self.alarm.ring_at(at);
        }
        self.held.push_back((at, c));
    }

    /// Completes `request` here, without the wrapped engine, and wakes the loop for it.
    fn complete_here(&mut self, request: Request, result: io::Result<usize>) {
        let c = request.complete(result);
        self.hold(c);
        let _ = self.inner.notifier().notify();
    }
}

impl<E: IoEngine> IoEngine for FaultyEngine<E> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
        if let Err(e) = request.validate() {
            return Err(SubmitError::new(e, request));
        }
        self.submitted += 1;
        let n = self.submitted;
        let errno = self
            .plan
            .fail_tokens
            .iter()
            .find(|(t, _)| *t == request.token)
            .map(|&(_, e)| e)
            .or(match self.plan.fail_every {
                Some((every, e)) if every > 0 && n % every == 0 => Some(e),
                _ => None,
            });
        if let Some(errno) = errno {
            self.count(|s| s.failed += 1);
            self.complete_here(request, Err(io::Error::from_raw_os_error(errno)));
            return Ok(());
        }
        if request.op.is_write() {
            self.writes += 1;
            if let Some(every) = self.plan.lose_write_every {
                if every > 0 && self.writes % every == 0 {
                    self.count(|s| s.lost_writes += 1);
                    let len = request.op.len();
                    self.complete_here(request, Ok(len));
                    return Ok(());
                }
            }
        }
        self.inner.submit(request)?;
        self.count(|s| s.forwarded += 1);
        Ok(())
    }

    fn plug(&mut self) {
        self.inner.plug()
    }

    fn unplug(&mut self) {
        self.inner.unplug()
    }

    fn set_max_batch(&mut self, max: usize) {
        self.inner.set_max_batch(max)
    }

    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let mut fresh = std::mem::take(&mut self.scratch);
        self.inner.poll_completions(&mut fresh);
        for c in fresh.drain(..) {
            self.hold(c);
        }
        self.scratch = fresh;
        let now = Instant::now();
        let due = self.held.iter().take_while(|(at, _)| *at <= now).count();
        let start = out.len();
        out.extend(self.held.drain(..due).map(|(_, c)| c));
        if self.plan.reorder && due > 1 {
            self.count(|s| s.reordered_batches += 1);
            out.make_contiguous()[start..].reverse();
        }
        due
    }

    fn has_completions(&self) -> bool {
        let now = Instant::now();
        self.held.front().is_some_and(|(at, _)| *at <= now) || self.inner.has_completions()
    }

    fn notifier(&self) -> &Notifier {
        self.inner.notifier()
    }

    fn notifiers(&self) -> Vec<&Notifier> {
        self.inner.notifiers()
    }

    fn clear_notifier(&self) {
        self.inner.clear_notifier()
    }

    fn cancel(&mut self, token: u64) -> bool {
        self.inner.cancel(token)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held.len()
    }

    fn drain(&mut self) -> Vec<Completion> {
        let mut all: Vec<Completion> = self.held.drain(..).map(|(_, c)| c).collect();
        all.extend(self.inner.drain());
        all
    }
}
