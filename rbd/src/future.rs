//! Requests as futures, for an executor of the caller's (an async storage layer, a test):
//! woken from librbd's thread, no loop needed.
//!
//! This module owns [`RbdFuture`] and the slot librbd's callback fills; it never runs the
//! executor. A future dropped before its end leaves the request running: its memory stays with
//! librbd until the callback, which then frees it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use aio_core::engine::LentMemory;

use crate::image::RbdImage;
use crate::submit::{submit, Deliver, RbdOp};

/// librbd's return value and the request's memory.
type Ended = (i64, Option<LentMemory>);

/// The end of a request, once librbd has told it, and who waits for it.
#[derive(Default)]
struct Slot {
    state: Mutex<(Option<Ended>, Option<Waker>)>,
}

impl Deliver for Slot {
    fn deliver(&self, _token: u64, ret: i64, memory: Option<LentMemory>) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.0 = Some((ret, memory));
            state.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A request in flight: resolves to librbd's result (bytes for a read) and the memory.
pub struct RbdFuture {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for RbdFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdFuture").finish_non_exhaustive()
    }
}

impl Future for RbdFuture {
    type Output = (io::Result<u64>, Option<LentMemory>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.slot.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.0.take() {
            Some((ret, memory)) => {
                let result = match crate::error::check(ret) {
                    Ok(n) => Ok(n),
                    Err(errno) => Err(io::Error::from_raw_os_error(errno)),
                };
                Poll::Ready((result, memory))
            }
            None => {
                state.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl RbdImage {
    /// Submits `op` (with `memory` for a read or write) and returns its end as a future,
    /// woken from librbd's thread: for an executor of the caller's. A loop's requests are
    /// better on an [`RbdQueue`](crate::RbdQueue), whose ends come in batches.
    pub fn submit(&self, op: RbdOp, memory: Option<LentMemory>) -> RbdFuture {
        let slot = Arc::new(Slot::default());
        submit(self, slot.clone(), 0, op, memory);
        RbdFuture { slot }
    }
}
