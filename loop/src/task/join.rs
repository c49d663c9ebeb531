//! [`join_all`]: wait for many futures of one type, outputs in order.
//!
//! This module owns that one combinator, so that a queue of requests (`QD 32`) needs no
//! dependency beyond std.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls every future until all are done and returns their outputs in the order given.
/// Each poll polls only the futures not done yet.
pub fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> JoinAll<F> {
    let futures: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let outputs = futures.iter().map(|_| None).collect();
    JoinAll { futures, outputs }
}

/// The future of [`join_all`].
#[must_use = "futures do nothing unless polled"]
pub struct JoinAll<F: Future> {
    futures: Vec<Option<Pin<Box<F>>>>,
    outputs: Vec<Option<F::Output>>,
}

impl<F: Future> std::fmt::Debug for JoinAll<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending = self.futures.iter().filter(|f| f.is_some()).count();
        f.debug_struct("JoinAll")
            .field("pending", &pending)
            .finish()
    }
}

// Nothing in it is pinned in place: the futures are boxed, the outputs only moved out.
impl<F: Future> Unpin for JoinAll<F> {}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut pending = false;
        for (slot, out) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(
            this.outputs
                .iter_mut()
                .map(|o| o.take().expect("done"))
                .collect(),
        )
    }
}
