//! The block I/O engine trait.
//!
//! This module owns [`IoEngine`] (the contract is written out in the [module
//! documentation](super)) and its forwarding through a `Box`, never a request's or a
//! completion's type (`request.rs`, `completion.rs`).

use std::collections::VecDeque;

use super::completion::Completion;
use super::request::{Request, SubmitError};
use crate::notifier::Notifier;

/// QEMU's default aio-max-batch: requests sent to the kernel per submission call.
pub const DEFAULT_MAX_BATCH: usize = 32;

/// A block I/O engine. See the [module documentation](super) for the contract.
pub trait IoEngine {
    /// A short, stable name (`"pool"`, `"linux-aio"`, `"uring"`).
    fn name(&self) -> &'static str;

    /// Accepts a request, or refuses it (handing it back) if it can never run.
    fn submit(&mut self, request: Request) -> Result<(), SubmitError>;

    /// Starts (or nests) a batch: submissions queue until the matching `unplug`, or until a
    /// whole batch is queued, which goes out at once (QEMU's rule). A whole batch is
    /// `set_max_batch` requests, or fewer while the kernel holds fewer (the
    /// [batch rule](crate::kit::queue#the-batch-rule)): on an idle device the first request goes at once.
    fn plug(&mut self);

    /// Ends a batch; at the outermost level, sends what queued.
    fn unplug(&mut self);

    /// Sets the largest batch sent per submission (at least 1).
    fn set_max_batch(&mut self, max: usize);

    /// Moves finished requests to `out` (no syscall where the engine can avoid one) and sends
    /// queued requests that now fit. Returns how many were moved.
    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize;

    /// Whether completions are waiting, without a syscall.
    fn has_completions(&self) -> bool;

    /// The notifier that becomes readable when completions are waiting.
    fn notifier(&self) -> &Notifier;

    /// Every notifier the loop must watch: [`notifier`](IoEngine::notifier) first, and for an
    /// engine that combines others ([`WithFallback`](super::WithFallback)) theirs after it. The loop registers each one;
    /// when the first is readable it calls [`clear_notifier`](IoEngine::clear_notifier), when
    /// another is readable it reads that notifier (`test_and_clear`). Either way it then
    /// collects completions.
    fn notifiers(&self) -> Vec<&Notifier> {
        vec![self.notifier()]
    }

    /// Clears the notifier's signal; the loop calls it when the notifier is reported readable,
    /// before it collects completions. The default reads the notifier. An engine whose
    /// readiness is reported without the notifier being written (io_uring on a ring shared
    /// with the fd monitor) overrides it and skips a syscall that would find nothing.
    fn clear_notifier(&self) {
        self.notifier().test_and_clear();
    }

    /// Cancels the request with `token`: if it is still queued in the engine it completes with
    /// `ECANCELED`; if it is in the kernel, the engine asks the kernel to stop it where the
    /// kernel can (see the module docs). Returns whether a cancel was done or requested; the
    /// request's completion comes either way.
    fn cancel(&mut self, token: u64) -> bool;

    /// Requests accepted whose completion has not been returned yet.
    fn in_flight(&self) -> usize;

    /// Waits for every accepted request to finish and returns all completions not yet
    /// returned (queued requests are sent, not cancelled).
    fn drain(&mut self) -> Vec<Completion>;
}

impl<E: IoEngine + ?Sized> IoEngine for Box<E> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
        (**self).submit(request)
    }
    fn plug(&mut self) {
        (**self).plug()
    }
    fn unplug(&mut self) {
        (**self).unplug()
    }
    fn set_max_batch(&mut self, max: usize) {
        (**self).set_max_batch(max)
    }
    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        (**self).poll_completions(out)
    }
    fn has_completions(&self) -> bool {
        (**self).has_completions()
    }
    fn notifier(&self) -> &Notifier {
        (**self).notifier()
    }
    fn notifiers(&self) -> Vec<&Notifier> {
        (**self).notifiers()
    }
    fn clear_notifier(&self) {
        (**self).clear_notifier()
    }
    fn cancel(&mut self, token: u64) -> bool {
        (**self).cancel(token)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    fn drain(&mut self) -> Vec<Completion> {
        (**self).drain()
    }
}
