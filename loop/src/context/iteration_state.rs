//! What a context's iterations share (QEMU's `aio_poll` state): [`IterationState`].
//!
//! This module owns that state; it never names the context: the order of an iteration's
//! steps, which reads and updates it, is `iteration.rs`'s.

use std::cell::{Cell, RefCell};
use std::io;

use aio_core::Event;

/// What a context's iterations share: how deeply they nest, the wait each dispatch belongs
/// to, the event buffers they reuse, the last wait error, and when the monitor last waited.
#[derive(Default)]
pub(super) struct IterationState {
    /// `poll()` calls on the stack.
    pub(super) depth: Cell<u32>,
    /// Numbers each iteration's wait: a report older than a handler's last dispatch is dropped.
    pub(super) dispatch_seq: Cell<u64>,
    /// One buffer per nesting level, kept between iterations.
    pub(super) event_buffers: RefCell<Vec<Vec<Event>>>,
    /// For [`AioContext::take_last_wait_error`](crate::AioContext::take_last_wait_error).
    pub(super) last_wait_error: RefCell<Option<io::Error>>,
    /// When the last wait on the monitor began (ns, the context's clock).
    pub(super) last_wait_ns: Cell<u64>,
}
