//! The loop that keeps a [`Target`] busy with a [`Generator`]'s requests: every slot filled,
//! each completion counted and its slot refilled at once, waits in between.
//!
//! This module owns the [`Target`] contract (how requests reach a disk) and [`drive`]; what
//! each request is and what gets counted is the generator's ([`super::generator`]).

use std::time::{Duration, Instant};

use super::generator::{Generator, Issued};

/// How a [`Generator`]'s requests reach a disk: queue one, send what was queued, take what
/// completed, wait for more.
///
/// Contract:
/// - `submit` queues a request on slot `request.slot` (or refuses it with an errno: it is then
///   counted as failed); it goes out at the latest with the next `flush`;
/// - `reap` moves the completions there are into `done`, as `(slot, bytes or errno)`, never
///   waiting, each request's once;
/// - `wait` returns once something may have completed, or after about `limit`;
/// - a target whose slots have memory returns it from `slot_memory` (a verifying generator
///   stamps and checks there).
pub trait Target {
    /// Why the target failed (its own error: a queue that cannot be kicked, a poll that
    /// failed); [`drive`] ends with it as [`DriveError::Target`].
    type Error: std::error::Error + 'static;

    /// Queues `request`, or refuses it with an errno.
    fn submit(&mut self, request: Issued) -> Result<(), i32>;

    /// Sends what `submit` queued (rings doorbells, ends a plugged batch). The default does
    /// nothing: `submit` sent it.
    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Moves the completions there are into `done`, without waiting.
    fn reap(&mut self, done: &mut Vec<(usize, Result<u64, i32>)>) -> Result<(), Self::Error>;

    /// Waits until something may have completed, or for about `limit`.
    fn wait(&mut self, limit: Duration) -> Result<(), Self::Error>;

    /// Whether to stop issuing before the deadline (another part of the run failed). The
    /// default never stops.
    fn stopped(&self) -> bool {
        false
    }

    /// Slot `slot`'s buffer (`None`: this target's slots have no memory the generator may
    /// use, and it cannot verify).
    ///
    /// # Safety
    ///
    /// `slot` has no request in flight (its last one completed and was reaped, its next one is
    /// not submitted), and the slice is not kept past the next call on this target.
    unsafe fn slot_memory(&mut self, slot: usize) -> Option<&mut [u8]>;
}

/// Why [`drive`] ended before the load did; `E` is the target's [`Target::Error`].
#[derive(Debug, thiserror::Error)]
pub enum DriveError<E: std::error::Error + 'static> {
    /// No completion came for `after` with requests in flight; they were given up
    /// ([`Generator::abandon`]).
    #[error(
        "no completion for {} s with {in_flight} request(s) in flight (the target stopped \
         answering)",
        after.as_secs()
    )]
    Stalled {
        /// The requests given up.
        in_flight: usize,
        /// How long nothing came.
        after: Duration,
    },
    /// The target failed.
    #[error(transparent)]
    Target(#[from] E),
}

/// Runs `generator` against `target`: every slot filled, then each completion counted and its
/// slot refilled at once, until the deadline (or the I/O limit, or the target stops), and then
/// until nothing is in flight. With requests in flight and no completion for `stall`, they
/// are given up and the drive fails.
pub fn drive<T: Target>(
    generator: &mut Generator<'_>,
    target: &mut T,
    stall: Duration,
) -> Result<(), DriveError<T::Error>> {
    let mut done = Vec::with_capacity(generator.slots());
    let start = Instant::now();
    for slot in 0..generator.slots() {
        issue_on(generator, target, slot, start);
    }
    let mut last_progress = start;
    loop {
        target.flush()?;
        done.clear();
        target.reap(&mut done)?;
        let now = Instant::now();
        if done.is_empty() {
            if generator.in_flight() == 0 {
                return Ok(());
            }
            let quiet = now.saturating_duration_since(last_progress);
            if quiet >= stall {
                let in_flight = generator.in_flight();
                generator.abandon();
                return Err(DriveError::Stalled {
                    in_flight,
                    after: stall,
                });
            }
            let deadline = generator.window().deadline;
            let limit = if now < deadline && !target.stopped() {
                deadline - now
            } else {
                stall - quiet
            };
            target.wait(limit)?;
            continue;
        }
        last_progress = now;
        let refill = !target.stopped();
        for &(slot, result) in &done {
            // SAFETY: the slot's request was reaped: nothing is in flight on it, and the slice
            // is let go before the next call on the target.
            let mem = unsafe { memory_for(generator, target, slot) };
            generator.complete(slot, result, now, mem.as_deref());
            if refill {
                issue_on(generator, target, slot, now);
            }
        }
    }
}

/// Issues free `slot`'s next request at `now` (if the generator has one) to `target`.
fn issue_on<T: Target>(generator: &mut Generator<'_>, target: &mut T, slot: usize, now: Instant) {
    // SAFETY: the slot is free (first fill, or its request was just completed), and the
    // slice is let go before `submit`.
    let mem = unsafe { memory_for(generator, target, slot) };
    let Some(request) = generator.issue(slot, now, mem) else {
        return;
    };
    if let Err(errno) = target.submit(request) {
        generator.refused(slot, errno);
    }
}

/// `slot`'s memory when `generator` verifies (it wants none otherwise).
///
/// # Safety
///
/// As for [`Target::slot_memory`].
unsafe fn memory_for<'t, T: Target>(
    generator: &Generator<'_>,
    target: &'t mut T,
    slot: usize,
) -> Option<&'t mut [u8]> {
    if !generator.verifies() {
        return None;
    }
    // SAFETY: the caller's promise, passed on.
    unsafe { target.slot_memory(slot) }
}
