//! [`StopHandle`]: what tells a running daemon to stop, from any thread.
//!
//! This module owns the stop flag and the control loop's wake-up; what stopping does is
//! [`run`](super::run)'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use aio_loop::NotifyHandle;

/// Tells a running [`run`](super::run) to stop: `Send + Sync + Clone`, for a signal handler, another
/// thread, or a test. Stopping before `run` starts makes it return as soon as it has started.
#[derive(Debug, Clone, Default)]
pub struct StopHandle {
    inner: Arc<StopInner>,
}

#[derive(Debug, Default)]
struct StopInner {
    stopped: AtomicBool,
    /// The control loop's wake-up, once `run` has one.
    wake: Mutex<Option<NotifyHandle>>,
}

impl StopHandle {
    /// A handle that has not said stop.
    pub fn new() -> Self {
        Self::default()
    }

    /// Says stop and wakes the control loop (async-signal-safe it is not: call it from a
    /// signal-handling thread, as `ctrlc` does, not from a signal handler).
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let wake = self
            .inner
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(wake) = wake.as_ref() {
            wake.notify();
        }
    }

    /// Whether stop was said.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Wakes `wake` (the control loop) when stop is said.
    pub(super) fn attach(&self, wake: NotifyHandle) {
        *self
            .inner
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(wake);
    }
}
