//! For writing an engine or a monitor: the pieces every backend shares, so that none writes
//! them twice. A user of the loop and of the engines needs none of this (see
//! [`engine`](crate::engine), and `aio-loop`'s `AioContext`). The loop (`aio-loop`) and the
//! conformance suite (`aio-conformance`) use it too: the slot store and the fd checks have
//! one home, here.
//!
//! This module owns the engine-writer toolkit, never the contracts themselves (those are
//! [`IoEngine`](crate::engine::IoEngine) and [`EventLoop`](crate::EventLoop)):
//!
//! * [`SubmitQueue`]: the plug/batch queue in front of a kernel interface, with
//!   [the batch rule](queue#the-batch-rule);
//! * [`InFlightTable`]: the requests a kernel-queue engine handed to the kernel, the iovecs
//!   built for them, and the mapping of a kernel result to "done", "again" or "failed";
//! * [`EngineCore`]: the queue, the table and the accepted/returned counts, with the
//!   [submit round](round) ([`EngineCore::begin_round`], [`SubmitRound`]: resubmissions
//!   first, then fresh requests) and
//!   [`engine_queue_methods!`](engine_queue_methods) writing the `IoEngine` methods that
//!   only queue or count work (`submit`, `plug`, `unplug`, `set_max_batch`, `in_flight`);
//! * [`with_setters!`](with_setters): the `with_*` setters of a config struct;
//! * [`Transfer`] and [`Step`]: resubmitting the remainder of a short read or write;
//! * [`run_blocking`]: every op run with blocking syscalls (a thread-pool worker's job), and
//!   [`RangeOp`]: how a discard or write-zeroes maps onto `fallocate` or `BLKDISCARD`;
//! * for monitors: the contract's two errors ([`already_registered`], [`not_registered`],
//!   checked by [`ensure_new`] / [`ensure_known`]) and the conversions of timeouts
//!   ([`timespec_from`], [`timespec_ptr`], [`timeout_ms_round_up`]) and of `-1` returns
//!   ([`cvt`]);
//! * [`BadConfig`]: the error of a config field that cannot work;
//! * [`Slots`] and [`SlotId`]: the generation-numbered slot store behind the in-flight table
//!   and the loop's handler, timer and bottom-half tables;
//! * [`fd_is_open`] and [`raise_fd_limit`]: an fd check and the open-fd limit;
//! * `live_buffers` (feature `testing`): the [`AlignedBuf`](crate::engine::AlignedBuf)s alive
//!   on this thread, for the conformance suite's leak checks.

mod blocking;
mod inflight;
pub mod queue;
pub mod round;
mod transfer;

pub use crate::event_loop::{already_registered, ensure_known, ensure_new, not_registered};
pub use crate::slots::{SlotId, Slots};
pub use crate::sys::{
    cvt, fd_is_open, raise_fd_limit, timeout_ms_round_up, timespec_from, timespec_ptr,
};
pub use blocking::{run_blocking, RangeOp};
pub use inflight::{EngineCore, InFlightTable, Outcome, Prepared, PreparedRw, WholeBuffer};
pub use queue::{Flush, SubmitQueue};
pub use round::SubmitRound;
pub use transfer::{Step, Transfer};

/// `AlignedBuf`s allocated minus those freed on this thread so far (feature `testing`): a
/// test that allocates and frees on one thread (the loop's) compares it before and after to
/// see that nothing leaked, and in between that nothing was freed early.
#[cfg(feature = "testing")]
pub fn live_buffers() -> isize {
    crate::engine::buf::LIVE_ON_THREAD.with(|n| n.get())
}

/// Writes the [`IoEngine`](crate::engine::IoEngine) methods that only queue work, for an engine
/// that keeps an [`EngineCore`] and sends what the queue releases with a method of its own.
///
/// Inside `impl IoEngine for MyEngine { ... }`:
///
/// ```ignore
/// aio_core::kit::engine_queue_methods!(core: core, send: submit_pending);
/// // or, with a check of its own before a request is accepted
/// // (fn(&self, &Request) -> Result<(), RequestError>):
/// aio_core::kit::engine_queue_methods!(core: core, send: submit_pending, check: check_buffered);
/// ```
///
/// `send(&mut self, flush: Flush)` hands the kernel what the queue releases
/// ([`Flush::ByBatchRule`]) or all of it ([`Flush::All`]). The macro writes `submit` (validate, check, queue, send), `plug`, `unplug` (send
/// when the outermost plug ends) and `set_max_batch`.
#[doc(hidden)]
#[macro_export]
macro_rules! __engine_queue_methods {
    (core: $core:ident, send: $send:ident $(, check: $check:ident)?) => {
        fn submit(
            &mut self,
            request: $crate::engine::Request,
        ) -> ::std::result::Result<(), $crate::engine::SubmitError> {
            $(
                if let Err(e) = self.$check(&request) {
                    return Err($crate::engine::SubmitError::new(e, request));
                }
            )?
            self.$core.accept(request)?;
            self.$send($crate::kit::Flush::ByBatchRule);
            Ok(())
        }

        fn plug(&mut self) {
            self.$core.queue.plug();
        }

        fn unplug(&mut self) {
            if self.$core.queue.unplug() {
                self.$send($crate::kit::Flush::ByBatchRule);
            }
        }

        fn set_max_batch(&mut self, max: usize) {
            self.$core.queue.set_max_batch(max);
        }

        fn in_flight(&self) -> usize {
            self.$core.in_flight()
        }
    };
}

/// A setting of a config that cannot work: which config, which field, and why. Engines return
/// it (as a variant of their own error) before they touch the kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{config}::{field}: {reason}")]
pub struct BadConfig {
    /// The config type (`"UringConfig"`).
    pub config: &'static str,
    /// The field (`"entries"`).
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl BadConfig {
    /// A bad `field` of `config`, and why.
    pub fn new(config: &'static str, field: &'static str, reason: impl Into<String>) -> Self {
        BadConfig {
            config,
            field,
            reason: reason.into(),
        }
    }
}

/// Writes `impl From<Error> for std::io::Error`, keeping the error (its message and source)
/// and choosing the `io::ErrorKind` with `kind`, a `fn(&Error) -> io::ErrorKind`, so that a
/// caller who expects `io::Error` gets a meaningful kind:
///
/// ```ignore
/// aio_core::kit::io_error_from!(MyError, |e| match e {
///     MyError::BadConfig(_) => std::io::ErrorKind::InvalidInput,
///     MyError::Io(source) => source.kind(),
/// });
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __io_error_from {
    ($ty:ty, $kind:expr) => {
        impl ::std::convert::From<$ty> for ::std::io::Error {
            fn from(e: $ty) -> ::std::io::Error {
                let kind: fn(&$ty) -> ::std::io::ErrorKind = $kind;
                ::std::io::Error::new(kind(&e), e)
            }
        }
    };
}

/// Writes builder-style setters for a `#[non_exhaustive]` config struct, so that adding an
/// option is not a breaking change and every config reads the same way:
///
/// ```ignore
/// aio_core::kit::with_setters!(MyConfig {
///     /// With `entries` submission-queue entries.
///     with_entries => entries: u32,
/// });
/// // MyConfig::default().with_entries(256)
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __with_setters {
    ($ty:ty { $($(#[$doc:meta])* $setter:ident => $field:ident: $fty:ty,)* }) => {
        impl $ty {
            $(
                $(#[$doc])*
                pub fn $setter(mut self, $field: $fty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

// The writer macros are documented here, under `kit`, and kept out of the crate root's
// docs (`#[macro_export]` puts them there under their hidden names).
#[doc(inline)]
pub use crate::__engine_queue_methods as engine_queue_methods;
#[doc(inline)]
pub use crate::__io_error_from as io_error_from;
#[doc(inline)]
pub use crate::__with_setters as with_setters;
