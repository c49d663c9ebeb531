//! The loop's nanosecond clock.
//!
//! This module owns time reading only. [`AioContext`](crate::AioContext) reads time through
//! [`Clock`] so that tests can drive timers and the adaptive-polling rule with a fake clock
//! ([`FakeClock`]) instead of sleeping.

use std::{cell::Cell, rc::Rc};

/// A monotonic nanosecond clock.
pub trait Clock {
    /// Nanoseconds since an arbitrary fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}

/// `CLOCK_MONOTONIC`, the default clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }
}

/// A clock that moves only when told to; clones share the same time. For tests of timers and
/// of the adaptive-polling rule ([`AioContext::with_clock`](crate::AioContext::with_clock));
/// `aio-conformance` re-exports it.
#[derive(Debug, Default, Clone)]
pub struct FakeClock {
    now: Rc<Cell<u64>>,
    step: Rc<Cell<u64>>,
}

impl FakeClock {
    /// A fake clock at `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self {
            now: Rc::new(Cell::new(start_ns)),
            step: Rc::new(Cell::new(0)),
        }
    }

    /// Makes every reading advance the clock by `step_ns` afterwards, so that code which
    /// spins until a deadline (busy polling) terminates under a fake clock.
    pub fn set_step(&self, step_ns: u64) {
        self.step.set(step_ns);
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.now.set(self.now.get().saturating_add(ns));
    }

    /// Sets the clock (it must not go backwards; a smaller value is ignored).
    pub fn set(&self, ns: u64) {
        if ns > self.now.get() {
            self.now.set(ns);
        }
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        let now = self.now.get();
        self.now.set(now.saturating_add(self.step.get()));
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_decreases() {
        let c = MonotonicClock;
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(b >= a && a > 0);
    }

    #[test]
    fn fake_moves_only_forward() {
        let c = FakeClock::new(10);
        let shared = c.clone();
        shared.advance(5);
        assert_eq!(c.now_ns(), 15);
        c.set(3);
        assert_eq!(c.now_ns(), 15);
    }
}
