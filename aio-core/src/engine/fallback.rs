//! `WithFallback`: one engine in front, a second one for the ops the first cannot run.
//!
//! This module owns the routing rule and the merging of two engines' completions and
//! notifiers. It never runs I/O itself and never looks inside either engine.

use std::collections::VecDeque;

use super::completion::{Completion, RequestError};
use super::io_engine::IoEngine;
use super::request::{Request, SubmitError};
use crate::notifier::Notifier;

/// Two engines behind one: every request goes to `primary`, and a request `primary` refuses
/// as [`RequestError::Unsupported`] goes to `fallback` instead. Both signal the same loop
/// (the loop, `aio-loop`'s `AioContext`, watches both notifiers) and their completions come
/// out of one [`poll_completions`](IoEngine::poll_completions).
///
/// QEMU sends discard and write-zeroes to its thread pool even with `aio=native`, because
/// the kernel's AIO has no `fallocate`; this is that, for any pair of engines:
///
/// ```no_run
/// # use aio_core::engine::{IoEngine, WithFallback};
/// # fn demo(linux_aio: impl IoEngine, pool: impl IoEngine) {
/// let engine = WithFallback::new(linux_aio, pool); // discard and write-zeroes go to the pool
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
pub struct WithFallback<A, B> {
    primary: A,
    fallback: B,
    sent_to_fallback: u64,
}

impl<A: IoEngine, B: IoEngine> WithFallback<A, B> {
    /// `primary` for everything it runs, `fallback` for what it refuses as unsupported.
    pub fn new(primary: A, fallback: B) -> Self {
        WithFallback {
            primary,
            fallback,
            sent_to_fallback: 0,
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
    pub fn sent_to_fallback(&self) -> u64 {
        self.sent_to_fallback
    }
}

impl<A: IoEngine, B: IoEngine> IoEngine for WithFallback<A, B> {
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
                self.sent_to_fallback += 1;
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::engine::{AlignedBuf, IoFile};

    /// Records what reaches it; refuses discards and write-zeroes as unsupported when asked.
    struct Counting {
        refuses_range: bool,
        ops: Vec<(u64, &'static str)>,
        cancels: Vec<u64>,
        notifier: Notifier,
        /// Plug depth, and the last `set_max_batch`.
        plugged: i32,
        max_batch: usize,
        /// Requests held until [`Counting::finish`], then their completions.
        held: Vec<Request>,
        done: VecDeque<Completion>,
    }

    impl Counting {
        fn new(refuses_range: bool) -> Self {
            Counting {
                refuses_range,
                ops: Vec::new(),
                cancels: Vec::new(),
                notifier: Notifier::new().unwrap(),
                plugged: 0,
                max_batch: 0,
                held: Vec::new(),
                done: VecDeque::new(),
            }
        }

        /// Completes every held request.
        fn finish(&mut self) {
            for r in self.held.drain(..) {
                self.done.push_back(r.complete(Ok(0)));
            }
        }
    }

    impl IoEngine for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
            if self.refuses_range && request.op.is_range() {
                let op = request.op.name();
                let reason = "no fallocate".to_string();
                let error = RequestError::Unsupported {
                    engine: "counting",
                    op,
                    reason,
                };
                return Err(SubmitError::new(error, request));
            }
            self.ops.push((request.token, request.op.name()));
            self.held.push(request);
            Ok(())
        }
        fn plug(&mut self) {
            self.plugged += 1;
        }
        fn unplug(&mut self) {
            self.plugged -= 1;
        }
        fn set_max_batch(&mut self, max: usize) {
            self.max_batch = max;
        }
        fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
            let n = self.done.len();
            out.extend(self.done.drain(..));
            n
        }
        fn has_completions(&self) -> bool {
            !self.done.is_empty()
        }
        fn notifier(&self) -> &Notifier {
            &self.notifier
        }
        fn cancel(&mut self, token: u64) -> bool {
            let ours = self.ops.iter().any(|(t, _)| *t == token);
            if ours {
                self.cancels.push(token);
            }
            ours
        }
        fn in_flight(&self) -> usize {
            self.held.len() + self.done.len()
        }
        fn drain(&mut self) -> Vec<Completion> {
            self.finish();
            self.done.drain(..).collect()
        }
    }

    fn null() -> IoFile {
        IoFile::new(std::fs::File::open("/dev/null").unwrap())
    }

    #[test]
    fn reads_stay_in_front_range_ops_go_behind_and_cancel_follows_them() {
        let mut r = WithFallback::new(Counting::new(true), Counting::new(false));
        let f = null();
        r.submit(Request::read(&f, 0, AlignedBuf::new(512), 1))
            .unwrap();
        r.submit(Request::discard(&f, 0, 4096, 2)).unwrap();
        r.submit(Request::write_zeroes(&f, 0, 4096, true, 3))
            .unwrap();
        assert_eq!(r.primary().ops, vec![(1, "read")]);
        let behind: Vec<u64> = r.fallback().ops.iter().map(|o| o.0).collect();
        assert_eq!(behind, vec![2, 3]);
        assert_eq!(r.sent_to_fallback(), 2);
        assert_eq!(r.in_flight(), 3);
        assert_eq!(r.name(), "counting", "the primary names the pair");
        assert_eq!(r.notifiers().len(), 2, "both engines are watched");
        // A routed token's cancel reaches the engine that holds it.
        assert!(r.cancel(2));
        assert_eq!(r.fallback().cancels, vec![2]);
        assert!(r.primary().cancels.is_empty());
        assert!(r.cancel(1));
        assert_eq!(r.primary().cancels, vec![1]);
    }

    #[test]
    fn an_op_both_refuse_is_the_callers_error_with_the_request_back() {
        let mut r = WithFallback::new(Counting::new(true), Counting::new(true));
        let f = null();
        let e = r.submit(Request::discard(&f, 0, 4096, 9)).unwrap_err();
        assert!(matches!(e.error, RequestError::Unsupported { .. }), "{e}");
        assert_eq!(e.request.token, 9);
        assert_eq!(r.sent_to_fallback(), 0);
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn batching_reaches_both_engines_and_so_do_completions() {
        let mut r = WithFallback::new(Counting::new(true), Counting::new(false));
        let f = null();
        r.plug();
        r.set_max_batch(7);
        assert_eq!((r.primary().plugged, r.fallback().plugged), (1, 1));
        assert_eq!((r.primary().max_batch, r.fallback().max_batch), (7, 7));
        r.unplug();
        assert_eq!((r.primary().plugged, r.fallback().plugged), (0, 0));
        r.submit(Request::read(&f, 0, AlignedBuf::new(512), 1))
            .unwrap();
        r.submit(Request::discard(&f, 0, 4096, 2)).unwrap();
        assert!(!r.has_completions());
        // Only the fallback's completion is ready: it is seen and collected.
        r.fallback.finish();
        assert!(r.has_completions(), "the fallback's completion is seen");
        let mut out = VecDeque::new();
        assert_eq!(r.poll_completions(&mut out), 1);
        assert_eq!(out.pop_front().map(|c| c.token), Some(2));
        assert!(!r.has_completions());
        // Then the primary's; drain hands back what both hold.
        r.submit(Request::discard(&f, 0, 4096, 3)).unwrap();
        r.primary.finish();
        assert_eq!(r.poll_completions(&mut out), 1);
        assert_eq!(out.pop_front().map(|c| c.token), Some(1));
        let drained: Vec<u64> = r.drain().iter().map(|c| c.token).collect();
        assert_eq!(drained, vec![3]);
        assert_eq!(r.in_flight(), 0);
    }

    /// `Box<E>` forwards every call to `E` (the bench and the daemon hold engines boxed).
    #[test]
    fn a_boxed_engine_forwards_every_call() {
        type Boxed = Box<Counting>;
        let mut b: Boxed = Box::new(Counting::new(false));
        let f = null();
        assert_eq!(<Boxed as IoEngine>::name(&b), "counting");
        <Boxed as IoEngine>::submit(&mut b, Request::read(&f, 0, AlignedBuf::new(512), 1)).unwrap();
        <Boxed as IoEngine>::submit(&mut b, Request::discard(&f, 0, 4096, 2)).unwrap();
        assert_eq!(b.ops, vec![(1, "read"), (2, "discard")]);
        <Boxed as IoEngine>::plug(&mut b);
        assert_eq!(b.plugged, 1);
        <Boxed as IoEngine>::unplug(&mut b);
        assert_eq!(b.plugged, 0);
        <Boxed as IoEngine>::set_max_batch(&mut b, 5);
        assert_eq!(b.max_batch, 5);
        assert!(<Boxed as IoEngine>::cancel(&mut b, 2));
        assert!(!<Boxed as IoEngine>::cancel(&mut b, 7));
        assert_eq!(b.cancels, vec![2]);
        assert_eq!(<Boxed as IoEngine>::in_flight(&b), 2);
        assert!(!<Boxed as IoEngine>::has_completions(&b));
        let fd = b.notifier.as_raw_fd();
        assert_eq!(<Boxed as IoEngine>::notifier(&b).as_raw_fd(), fd);
        let notifiers = <Boxed as IoEngine>::notifiers(&b);
        assert_eq!(
            notifiers.iter().map(|n| n.as_raw_fd()).collect::<Vec<_>>(),
            [fd]
        );
        b.notifier.notify().unwrap();
        <Boxed as IoEngine>::clear_notifier(&b);
        assert!(!b.notifier.test_and_clear(), "the box cleared it");
        b.finish();
        assert!(<Boxed as IoEngine>::has_completions(&b));
        let mut out = VecDeque::new();
        assert_eq!(<Boxed as IoEngine>::poll_completions(&mut b, &mut out), 2);
        <Boxed as IoEngine>::submit(&mut b, Request::read(&f, 0, AlignedBuf::new(512), 3)).unwrap();
        let drained: Vec<u64> = <Boxed as IoEngine>::drain(&mut b)
            .iter()
            .map(|c| c.token)
            .collect();
        assert_eq!(drained, vec![3]);
    }
}
