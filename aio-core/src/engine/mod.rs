//! The block I/O engine contract (`IoEngine`) and what every engine shares.
//!
//! This module owns the trait, its documentation and the types a user of an engine handles:
//! requests and completions ([`Request`], [`Op`], [`RwFlags`], [`Completion`], [`IoFile`]),
//! O_DIRECT buffers ([`AlignedBuf`]), caller-owned memory ([`GuestIovecs`]), the routing of
//! ops one engine lacks to another ([`WithFallback`]) and the attachment of an engine to an
//! [`AioContext`](crate::AioContext) ([`AttachedEngine`], with per-request completion
//! callbacks). It performs no I/O itself. What only an engine author needs (the
//! plug/batch queue, the in-flight table, short-transfer arithmetic) is in
//! [`backend`](crate::backend).
//!
//! # The contract an engine keeps
//!
//! * **Ownership.** `submit` takes the [`Request`] by value, buffers included; the buffers come
//!   back only in the request's [`Completion`]. No safe API exposes a buffer the kernel or a
//!   worker may still write, and an engine never frees one before that is over.
//! * **Exactly once.** Every accepted request produces exactly one completion with its token,
//!   returned by exactly one `poll_completions` (or `drain`) call.
//! * **Refusal is immediate and typed.** A request that can never run ([`Request::validate`]
//!   fails, among others for `O_DIRECT` alignment; the engine is shut down; the op is
//!   unsupported by this engine, which [`WithFallback`] turns into a hand-over to a second engine)
//!   is refused by `submit` with a
//!   [`SubmitError`] that hands the request back. Errors from the kernel are per request: they
//!   arrive in that request's completion (`result` carries the errno) and do not disturb the
//!   others.
//! * **Never full.** What does not fit the kernel or the workers right now is queued, not
//!   refused. `EAGAIN` and `EINTR` are retried, never reported.
//! * **Whole transfers.** Short reads and writes are resubmitted for the remainder
//!   ([`Transfer`](crate::backend::Transfer)); a read that reaches end of file completes with
//!   the bytes that exist (0 at or past EOF). A discard or write-zeroes completes with its
//!   length.
//! * **Ops.** Every engine runs reads and writes of [`AlignedBuf`]s and of caller-owned
//!   memory ([`GuestIovecs`]), `fsync` and `fdatasync`, with [`RwFlags`] (`RWF_DSYNC` for FUA,
//!   `RWF_NOWAIT`; a request with `NOWAIT` gets `EAGAIN` reported, not retried). Discard and
//!   write-zeroes ([`Op::Discard`], [`Op::WriteZeroes`]) run where the engine's kernel
//!   interface has them; an engine without them refuses them with
//!   [`RequestError::Unsupported`], and [`WithFallback`] sends them to one that has them.
//! * **Batching.** Between `plug()` and `unplug()` (nestable) submissions queue until a whole
//!   batch is queued; `unplug()` sends the rest. A batch is at most `max_batch` (default
//!   [`DEFAULT_MAX_BATCH`], QEMU's aio-max-batch) and never larger than the work the kernel
//!   already holds (at least 1), so an idle device gets its first request at once and batches
//!   grow 1, 1, 2, 4, ... (the [batch rule](crate::backend::queue#the-batch-rule), kept by
//!   [`SubmitQueue`](crate::backend::SubmitQueue)).
//! * **Signalling.** The engine's [`Notifier`] becomes readable when completions are waiting;
//!   `has_completions()` says the same without a syscall (the `io_poll` check).
//! * **Cancel** is best effort: a request still queued in the engine completes with
//!   `ECANCELED`; one already with the kernel is cancelled where the kernel can stop it
//!   (io_uring's `ASYNC_CANCEL`; it then completes with `ECANCELED`), else it completes
//!   normally. Linux AIO cannot stop a read or write in the kernel (`io_cancel` gives `EINVAL`
//!   for them: the kernel gives only poll and USB-gadget requests a cancel function); the pool
//!   cancels work no thread has started. Either way the completion comes, exactly once, and
//!   the memory is released only then.
//! * **Drop** with requests in flight waits until the kernel or the workers are done with their
//!   buffers and guest memory (queued requests are cancelled), then frees them. An engine that
//!   cannot learn that the kernel is done leaks its buffers, and aborts the process if any of
//!   that memory is a caller's ([`GuestIovecs`]). `drain()` does the same and
//!   hands every outstanding completion back.

pub(crate) mod attached;
pub(crate) mod buf;
mod completion;
mod fallback;
mod file;
mod guest;
mod request;
#[cfg(test)]
mod types_tests;

use std::collections::VecDeque;

pub use attached::{AttachedEngine, RequestId, PER_REQUEST_TOKEN_BIT};
pub use buf::{AlignedBuf, BufError, DEFAULT_ALIGN};
pub use completion::{Completion, IoBuffers, RequestError, SubmitError, IOV_MAX};
pub use fallback::WithFallback;
pub use file::{DirectIoAlignment, FileKind, IoFile};
pub use guest::GuestIovecs;
pub use request::{Op, Request, RwFlags};

use crate::notifier::Notifier;

/// QEMU's default aio-max-batch: requests sent to the kernel per submission call.
pub const DEFAULT_MAX_BATCH: usize = 32;

/// A block I/O engine. See the [module documentation](self) for the contract.
pub trait IoEngine {
    /// A short, stable name (`"pool"`, `"linux-aio"`, `"uring"`).
    fn name(&self) -> &'static str;

    /// Accepts a request, or refuses it (handing it back) if it can never run.
    fn submit(&mut self, request: Request) -> Result<(), SubmitError>;

    /// Starts (or nests) a batch: submissions queue until the matching `unplug`, or until a
    /// whole batch is queued, which goes out at once (QEMU's rule). A whole batch is
    /// `set_max_batch` requests, or fewer while the kernel holds fewer (the
    /// [batch rule](crate::backend::queue#the-batch-rule)): on an idle device the first request goes at once.
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
    /// engine that combines others ([`WithFallback`]) theirs after it. The loop registers each one;
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
