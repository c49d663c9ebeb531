//! Cross-thread wake-ups, the context's side: [`AioContext::notify`] and
//! [`AioContext::notify_handle`] (QEMU's `aio_notify`).
//!
//! This module owns those two calls; what other threads reach ([`NotifyHandle`] and the
//! state behind it) is `shared.rs`'s.

use super::shared::NotifyHandle;
use crate::AioContext;
use aio_core::EventLoop;

impl<L: EventLoop> AioContext<L> {
    /// Wakes the loop (see [`NotifyHandle::notify`]).
    pub fn notify(&self) {
        self.shared.notify();
    }

    /// A handle that wakes this context from any thread.
    pub fn notify_handle(&self) -> NotifyHandle {
        NotifyHandle {
            shared: self.shared.clone(),
        }
    }
}
