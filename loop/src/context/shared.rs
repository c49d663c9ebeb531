//! Cross-thread wake-ups: the part of a context other threads reach (QEMU's `aio_notify`).
//!
//! This module owns [`NotifyHandle`] and the shared state behind it. That state holds the
//! bottom-half queue, whose type and operations are `bh_queue`'s, and the notify_me
//! handshake, which is `wakeup`'s. It never runs a callback and never names the context: the
//! context's own `notify()` and `notify_handle()` are `notify.rs`'s.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::bh_queue::BhQueue;
use super::wakeup::Wakeup;
use aio_core::Notifier;
use aio_core::Token;

/// The token of the context's own notifier in the monitor (never a handler's token: handler
/// tokens have a generation >= 1 in their high half and an index < 2^32 - 1 in the low half).
pub(super) const CONTEXT_NOTIFIER: Token = Token(u64::MAX);

/// The part of a context that other threads reach.
pub(crate) struct Shared {
    pub(super) notifier: Notifier,
    /// The notify_me handshake: only while the loop is (about to be) blocked does `notify()`
    /// write the notifier.
    pub(super) wakeup: Wakeup,
    pub(super) notifier_writes: AtomicU64,
    pub(super) notify_calls: AtomicU64,
    /// Schedules on their way to the loop (`bottom_half`).
    pub(super) bh_queue: BhQueue,
    /// The thread that runs the loop: a bottom half scheduled from it needs no wake-up.
    pub(super) loop_thread: std::thread::ThreadId,
}

impl Shared {
    /// Wakes the loop only if it is (about to be) blocked: an idle bottom half was queued.
    pub(crate) fn notify_if_blocked(&self) {
        self.notify_with(Wakeup::notify_if_blocked);
    }

    pub(crate) fn notify(&self) {
        // Either the loop sees the notification (or the queued bottom half) before it sleeps,
        // or we see it about to sleep and write (see `wakeup`).
        self.notify_with(Wakeup::notify);
    }

    /// Counts a notification and writes the notifier when `handshake` says the loop may sleep.
    fn notify_with(&self, handshake: impl FnOnce(&Wakeup) -> bool) {
        self.notify_calls.fetch_add(1, Ordering::Relaxed);
        if handshake(&self.wakeup) {
            self.notifier_writes.fetch_add(1, Ordering::Relaxed);
            // A write can only fail if the fd is gone, which the context prevents by owning it.
            let _ = self.notifier.notify();
        }
    }

    /// Whether the caller is the loop's own thread (it will see queued work before it
    /// blocks, so it needs no notification).
    pub(crate) fn on_loop_thread(&self) -> bool {
        std::thread::current().id() == self.loop_thread
    }
}

/// A `Send + Sync` handle that wakes a context from any thread.
#[derive(Clone)]
pub struct NotifyHandle {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for NotifyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyHandle").finish_non_exhaustive()
    }
}

impl NotifyHandle {
    /// Wakes the context: a blocked `poll(true)` returns, a busy-polling one stops polling.
    /// Writes the notifier only when the loop is (about to be) blocked.
    pub fn notify(&self) {
        self.shared.notify();
    }
}
