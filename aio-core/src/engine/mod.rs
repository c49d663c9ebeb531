//! The block I/O engine contract (`IoEngine`) and what every engine shares.
//!
//! This module owns the trait, its documentation and the types a user of an engine handles:
//! requests and completions ([`Request`], [`Op`], [`RwFlags`], [`Completion`], [`IoFile`]),
//! O_DIRECT buffers ([`AlignedBuf`]), memory a caller lends ([`LentMemory`]), the routing of
//! ops one engine lacks to another ([`WithFallback`]). The attachment of an engine to a loop
//! (`AttachedEngine`, with per-request completion callbacks) is `aio-loop`'s. It performs no
//! I/O itself. What only an engine author needs (the
//! plug/batch queue, the in-flight table, short-transfer arithmetic) is in
//! [`kit`](crate::kit).
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
//!   ([`Transfer`](crate::kit::Transfer)); a read that reaches end of file completes with
//!   the bytes that exist (0 at or past EOF). A discard or write-zeroes completes with its
//!   length.
//! * **Ops.** Every engine runs reads and writes of [`AlignedBuf`]s and of caller-owned
//!   memory ([`LentMemory`]), `fsync` and `fdatasync`, with [`RwFlags`] (`RWF_DSYNC` for FUA,
//!   `RWF_NOWAIT`; a request with `NOWAIT` gets `EAGAIN` reported, not retried). Discard and
//!   write-zeroes ([`Op::Discard`], [`Op::WriteZeroes`]) run where the engine's kernel
//!   interface has them; an engine without them refuses them with
//!   [`RequestError::Unsupported`], and [`WithFallback`] sends them to one that has them.
//! * **Batching.** Between `plug()` and `unplug()` (nestable) submissions queue until a whole
//!   batch is queued; `unplug()` sends the rest. A batch is at most `max_batch` (default
//!   [`DEFAULT_MAX_BATCH`], QEMU's aio-max-batch) and never larger than the work the kernel
//!   already holds (at least 1), so an idle device gets its first request at once and batches
//!   grow 1, 1, 2, 4, ... (the [batch rule](crate::kit::queue#the-batch-rule), kept by
//!   [`SubmitQueue`](crate::kit::SubmitQueue)).
//! * **Signalling.** The engine's [`Notifier`](crate::Notifier) becomes readable when completions are waiting;
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
//!   that memory is a caller's ([`LentMemory`]). `drain()` does the same and
//!   hands every outstanding completion back.

pub(crate) mod buf;
mod completion;
mod fallback;
mod file;
mod flags;
mod io_engine;
mod lent;
mod request;
#[cfg(test)]
pub(crate) mod types_tests;

pub use buf::{AlignedBuf, BufError, DEFAULT_ALIGN};
pub use completion::{Completion, IoBuffers, RequestError, IOV_MAX};
pub use fallback::WithFallback;
pub use file::{DirectIoAlignment, FileKind, IoFile};
pub use flags::RwFlags;
pub use io_engine::{IoEngine, DEFAULT_MAX_BATCH};
#[allow(deprecated)]
pub use lent::GuestIovecs;
pub use lent::{LentMemory, MemoryHold, ReturnedBuf};
pub use request::{Op, Request, SubmitError};
