//! `Routed`: one engine in front, a second one for the ops the first cannot run.
//!
//! This module owns the routing rule and the merging of two engines' completions and
//! notifiers. It never runs I/O itself and never looks inside either engine.

use std::collections::VecDeque;

use super::completion::{Completion, RequestError, SubmitError};
use super::request::Request;
use super::IoEngine;
use crate::notifier::Notifier;

/// Two engines behind one: every request goes to `primary`, and a request `primary` refuses
/// as [`RequestError::Unsupported`] goes to `fallback` instead. Both signal the same loop
/// (an [`AioContext`](crate::AioContext) watches both notifiers) and their completions come
/// out of one [`poll_completions`](IoEngine::poll_completions).
///
/// QEMU sends discard and write-zeroes to its thread pool even with `aio=native`, because
/// the kernel's AIO has no `fallocate`; this is that, for any pair of engines:
///
/// ```no_run
/// # use aio_core::engine::{IoEngine, Routed};
/// # fn demo(linux_aio: impl IoEngine, pool: impl IoEngine) {
/// let engine = Routed::new(linux_aio, pool); // discard and write-zeroes go to the pool
/// # }
/// ```
///
/// * Tokens are the caller's on both sides; `cancel(token)` asks `primary`, then `fallback`.
/// * `plug` / `unplug` / `set_max_batch` apply to both; `drain` drains both.
/// * [`notifiers`](IoEngine::notifiers) lists both engines' notifiers; the loop reads the
///   fallback's only when that one is readable, so a loop whose requests all go to `primary`
///   pays nothing for the second engine.
/// * `name()` is the primary's.
#[derive(Debug)]
pub struct Routed<A, B> {
    primary: A,
    fallback: B,
    routed: u64,
}

impl<A: IoEngine, B: IoEngine> Routed<A, B> {
    /// `primary` for everything it runs, `fallback` for what it refuses as unsupported.
    pub fn new(primary: A, fallback: B) -> Self {
        Routed {
            primary,
            fallback,
            routed: 0,
        }
    }

    /// The primary engine.
    pub fn primary(&self) -> &A {
        &self.primary
    }

    /// The primary engine, mutably (for engine-specific calls).
    pub fn primary_mut(&mut self) -> &mut A {
        &mut self.primary
    }

    /// The fallback engine.
    pub fn fallback(&self) -> &B {
        &self.fallback
    }

    /// The fallback engine, mutably.
    pub fn fallback_mut(&mut self) -> &mut B {
        &mut self.fallback
    }

    /// Requests sent to the fallback so far.
    pub fn routed(&self) -> u64 {
        self.routed
    }
}

impl<A: IoEngine, B: IoEngine> IoEngine for Routed<A, B> {
    fn name(&self) -> &'static str {
        self.primary.name()
    }

    fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
        match self.primary.submit(request) {
            Err(SubmitError {
                error: RequestError::Unsupported { .. },
                request,
            }) => {
                self.fallback.submit(*request)?;
                self.routed += 1;
                Ok(())
            }
            other => other,
        }
    }

    fn plug(&mut self) {
        self.primary.plug();
        self.fallback.plug();
    }

    fn unplug(&mut self) {
        self.primary.unplug();
        self.fallback.unplug();
    }

    fn set_max_batch(&mut self, max: usize) {
        self.primary.set_max_batch(max);
        self.fallback.set_max_batch(max);
    }

    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let mut n = self.primary.poll_completions(out);
        if self.fallback.in_flight() > 0 {
            n += self.fallback.poll_completions(out);
        }
        n
    }

    fn has_completions(&self) -> bool {
        self.primary.has_completions()
            || (self.fallback.in_flight() > 0 && self.fallback.has_completions())
    }

    fn notifier(&self) -> &Notifier {
        self.primary.notifier()
    }

    fn notifiers(&self) -> Vec<&Notifier> {
        let mut all = self.primary.notifiers();
        all.extend(self.fallback.notifiers());
        all
    }

    fn clear_notifier(&self) {
        self.primary.clear_notifier();
    }

    fn cancel(&mut self, token: u64) -> bool {
        self.primary.cancel(token) || self.fallback.cancel(token)
    }

    fn in_flight(&self) -> usize {
        self.primary.in_flight() + self.fallback.in_flight()
    }

    fn drain(&mut self) -> Vec<Completion> {
        let mut all = self.primary.drain();
        all.extend(self.fallback.drain());
        all
    }
}
