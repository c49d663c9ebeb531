//! Timer futures: [`sleep`] and [`timeout`], on the clock of the context that polls them.
//!
//! This module owns the two futures and their timer's life: armed on first poll, freed when it
//! fires or when the future is dropped. It never reads a clock of its own: a context with a
//! [`FakeClock`](crate::FakeClock) makes them fake too.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::current::with_current;
use crate::context::timer_table::TimerId;

/// Completes once `duration` has passed on the polling context's clock (never before: the
/// context's timers never fire early). Polled outside a context it completes with the error
/// that says so.
pub fn sleep(duration: Duration) -> Sleep {
    Sleep {
        duration,
        state: None,
    }
}

/// The armed part of a [`Sleep`].
#[derive(Debug)]
struct Armed {
    timer: TimerId,
    fired: Rc<Cell<bool>>,
}

/// The future of [`sleep`].
///
/// `!Send`: it arms a timer of the loop that polls it.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Sleep {
    duration: Duration,
    state: Option<Armed>,
}

impl Future for Sleep {
    type Output = std::io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &this.state {
            Some(armed) if armed.fired.get() => {
                let timer = armed.timer;
                this.state = None;
                let _ = with_current(|ctx| ctx.cancel_timer(timer));
                Poll::Ready(Ok(()))
            }
            Some(_) => Poll::Pending,
            None => {
                let duration = this.duration;
                let fired = Rc::new(Cell::new(false));
                let (f, waker) = (fired.clone(), cx.waker().clone());
                let armed = with_current(|ctx| {
                    let deadline = ctx
                        .now_ns()
                        .saturating_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX));
                    ctx.call_at(
                        deadline,
                        Box::new(move || {
                            f.set(true);
                            waker.wake();
                        }),
                    )
                });
                match armed {
                    Ok(timer) => {
                        this.state = Some(Armed { timer, fired });
                        Poll::Pending
                    }
                    Err(e) => Poll::Ready(Err(e)),
                }
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(armed) = self.state.take() {
            // Outside a context (the context itself is being dropped) the timer goes with it.
            let _ = with_current(|ctx| ctx.cancel_timer(armed.timer));
        }
    }
}

/// `future`, or [`Elapsed`] if it is not done within `duration`: the future is dropped then
/// (cancelled, as dropping cancels).
pub fn timeout<F: Future>(duration: Duration, future: F) -> Timeout<F> {
    Timeout {
        future: Box::pin(future),
        sleep: sleep(duration),
    }
}

/// The future of [`timeout`] did not finish in time (or the timer could not be armed outside
/// a context).
#[derive(Debug, thiserror::Error)]
#[error("timed out")]
pub struct Elapsed;

/// The future of [`timeout`].
#[must_use = "futures do nothing unless polled"]
pub struct Timeout<F: Future> {
    future: Pin<Box<F>>,
    sleep: Sleep,
}

impl<F: Future> std::fmt::Debug for Timeout<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeout")
            .field("sleep", &self.sleep)
            .finish()
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(out) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Ready(_) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}
