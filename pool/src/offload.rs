//! The pool attached to a loop: I/O completions and typed results of offloaded closures,
//! delivered on the loop thread.
//!
//! This module owns the mapping from offload tokens to the closures waiting for their
//! results. Delivery itself (notifier, `io_poll`, the nested-loop safety net) is aio-loop's
//! [`AttachedEngine`]; nothing here duplicates it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};

use aio_core::engine::{Completion, Request, RequestError, SubmitError};
use aio_core::{AioError, EventLoop};
use aio_loop::AioContext;
use aio_loop::AttachedEngine;

use crate::ThreadPool;

/// Tokens with this bit set belong to offloaded work ([`PoolContext::run`]); I/O requests
/// submitted through a [`PoolContext`] must leave it clear.
pub const WORK_TOKEN_BIT: u64 = 1 << 63;

type Continuation<L> = Box<dyn FnOnce(&AioContext<L>, io::Result<()>)>;

/// What offloaded work and its future share.
struct Offloaded<T> {
    result: Option<io::Result<T>>,
    waker: Option<Waker>,
}

impl<T> Default for Offloaded<T> {
    fn default() -> Self {
        Offloaded {
            result: None,
            waker: None,
        }
    }
}

/// Cancels the work of a [`PoolContext::run_async`] future dropped before its result.
struct CancelOnDrop<L: EventLoop, T> {
    engine: AttachedEngine<L, ThreadPool>,
    token: u64,
    shared: Rc<RefCell<Offloaded<T>>>,
    done: Cell<bool>,
}

impl<L: EventLoop, T> Drop for CancelOnDrop<L, T> {
    fn drop(&mut self) {
        if !self.done.get() && self.shared.borrow().result.is_none() {
            self.engine.cancel(self.token);
        }
    }
}

/// A [`ThreadPool`] attached to an [`AioContext`]: submit I/O, or run any blocking closure on
/// a pool thread and get its result back in the loop.
///
/// `!Send`: it is the pool attached to one loop; from other threads, send closures to that
/// loop's thread ([`IoThreadHandle::run`](aio_loop::IoThreadHandle::run)).
pub struct PoolContext<L: EventLoop> {
    engine: AttachedEngine<L, ThreadPool>,
    waiting: Rc<RefCell<HashMap<u64, Continuation<L>>>>,
    next_token: Cell<u64>,
}

impl<L: EventLoop> fmt::Debug for PoolContext<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolContext")
            .field("waiting", &self.waiting.borrow().len())
            .finish_non_exhaustive()
    }
}

impl<L: EventLoop + 'static> PoolContext<L> {
    /// Attaches `pool` to `ctx`; I/O completions go to `on_io_complete`.
    pub fn attach(
        ctx: &AioContext<L>,
        pool: ThreadPool,
        on_io_complete: impl Fn(&AioContext<L>, Completion) + 'static,
    ) -> Result<Self, AioError> {
        let waiting: Rc<RefCell<HashMap<u64, Continuation<L>>>> = Rc::default();
        let w = waiting.clone();
        let engine = ctx.attach_engine(pool, move |ctx, completion| {
            if completion.token & WORK_TOKEN_BIT == 0 {
                on_io_complete(ctx, completion);
                return;
            }
            let continuation = w.borrow_mut().remove(&completion.token);
            if let Some(k) = continuation {
                k(ctx, completion.result.map(|_| ()));
            }
        })?;
        Ok(PoolContext {
            engine,
            waiting,
            next_token: Cell::new(0),
        })
    }

    /// Submits an I/O request (its token must not have [`WORK_TOKEN_BIT`] set).
    pub fn submit(&self, request: Request) -> Result<(), SubmitError> {
        if request.token & WORK_TOKEN_BIT != 0 {
            return Err(SubmitError::new(
                RequestError::ReservedToken {
                    token: request.token,
                    bit: WORK_TOKEN_BIT.trailing_zeros(),
                    reserved_for: "the pool's offloaded work",
                },
                request,
            ));
        }
        self.engine.submit(request)
    }

    /// Runs `work` on a pool thread; `then` receives its result on the loop thread
    /// (`Err(ECANCELED)` if cancelled first, an error if `work` panicked). Returns the token,
    /// usable with [`PoolContext::cancel`].
    pub fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
        then: impl FnOnce(&AioContext<L>, io::Result<T>) + 'static,
    ) -> Result<u64, RequestError> {
        let token = WORK_TOKEN_BIT | self.next_token.get();
        self.next_token
            .set((self.next_token.get() + 1) & !WORK_TOKEN_BIT);
        let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
        let worker_slot = slot.clone();
        self.engine.with_engine(|pool| {
            pool.submit_work(token, move || {
                let value = work();
                *worker_slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
                Ok(0)
            })
        })?;
        self.waiting.borrow_mut().insert(
            token,
            Box::new(move |ctx, result| {
                let value = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
                let outcome = result.and_then(|()| {
                    value.ok_or_else(|| io::Error::other("offloaded work produced no value"))
                });
                then(ctx, outcome)
            }),
        );
        Ok(token)
    }

    /// Runs `work` on a pool thread, as a future of its result (on the loop thread, in a task
    /// or [`AioContext::block_on`]): the typed offload of [`PoolContext::run`] for async code
    /// (tokio's `spawn_blocking`, on the loop). Dropping the future before it is done cancels
    /// the work if no thread has started it; work already running finishes and its result is
    /// discarded.
    pub fn run_async<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = io::Result<T>> + 'static {
        let shared: Rc<RefCell<Offloaded<T>>> = Rc::default();
        let s = shared.clone();
        let started = self.run(work, move |_, result| {
            let waker = {
                let mut st = s.borrow_mut();
                st.result = Some(result);
                st.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        });
        let pending = match started {
            Ok(token) => Some(CancelOnDrop {
                engine: self.engine.clone(),
                token,
                shared: shared.clone(),
                done: Cell::new(false),
            }),
            Err(e) => {
                shared.borrow_mut().result = Some(Err(e.into()));
                None
            }
        };
        std::future::poll_fn(move |cx| {
            let mut st = shared.borrow_mut();
            match st.result.take() {
                Some(result) => {
                    if let Some(p) = &pending {
                        p.done.set(true);
                    }
                    Poll::Ready(result)
                }
                None => {
                    st.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
    }

    /// The attached engine, for its futures ([`AttachedEngine::read`] and the others) and
    /// per-request callbacks.
    pub fn engine(&self) -> &AttachedEngine<L, ThreadPool> {
        &self.engine
    }

    /// Cancels queued I/O or work that no thread has started (it completes with `ECANCELED`).
    pub fn cancel(&self, token: u64) -> bool {
        self.engine.cancel(token)
    }

    /// Opens a batch of I/O submissions.
    pub fn plug(&self) {
        self.engine.plug();
    }

    /// Closes a batch of I/O submissions.
    pub fn unplug(&self) {
        self.engine.unplug();
    }

    /// Requests and work submitted and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }

    /// Completions (I/O and work) delivered so far.
    pub fn delivered(&self) -> u64 {
        self.engine.delivered()
    }

    /// How many times the nested-loop safety net had to deliver.
    pub fn safety_net_runs(&self) -> u64 {
        self.engine.safety_net_runs()
    }

    /// Runs `f` with the pool (limits, statistics).
    pub fn with_pool<R>(&self, f: impl FnOnce(&mut ThreadPool) -> R) -> R {
        self.engine.with_engine(f)
    }
}
