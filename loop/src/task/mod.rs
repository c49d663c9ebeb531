//! async/await on the loop: an executor inside [`AioContext`], QEMU's coroutines in an
//! `AioContext` written as Rust futures.
//!
//! This module owns [`AioContext::spawn`], [`AioContext::block_on`] and [`JoinHandle`]; the
//! executor (`executor.rs`), the current-context view the loop's futures use (`current.rs`),
//! the timer futures [`sleep`] and [`timeout`] (`time.rs`), the readiness futures
//! [`readable`] and [`writable`] (`readiness.rs`), the engine futures on
//! [`AttachedEngine`](crate::attached::AttachedEngine) (`io.rs`) and [`join_all`] (`join.rs`). No extra thread, no global runtime, no
//! dependency beyond std.
//!
//! * **Tasks** are `!Send` futures spawned on a context and polled by a bottom half of that
//!   context, in the loop's own iterations, so adaptive polling, nested `poll()`, every
//!   monitor and every engine work as they do for callbacks.
//! * **Wakers** are `Send + Sync`: a wake schedules that bottom half, from any thread, through
//!   the context's notify path (the eventfd is written only if the loop is blocked).
//! * **`block_on`** polls one future on the calling thread and runs the loop while it is
//!   pending; it may be called inside a callback or a task (a nested loop, QEMU's
//!   `AIO_WAIT_WHILE` in a coroutine), and neither deadlocks nor loses a completion.
//! * **Cancellation** is dropping: a dropped engine future cancels its request where the engine
//!   can and never frees or reuses the request's memory early (the engine keeps it until the
//!   kernel or the worker is done, then discards the late completion); a dropped timer or
//!   readiness future unregisters itself.
//!
//! ```no_run
//! # fn demo<L: aio_core::EventLoop + 'static>(ctx: &aio_loop::AioContext<L>) {
//! use std::time::Duration;
//! let task = ctx.spawn(async {
//!     aio_loop::task::sleep(Duration::from_millis(1)).await;
//!     6 * 7
//! });
//! assert_eq!(ctx.block_on(task).unwrap(), 42);
//! # }
//! ```

mod current;
pub(crate) mod executor;
mod io;
mod join;
mod readiness;
mod time;

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use executor::Executor;
pub use io::RequestFuture;
pub use join::{join_all, JoinAll};
pub use readiness::{readable, writable, Readiness};
pub use time::{sleep, timeout, Elapsed, Sleep, Timeout};

use crate::context::shared::NotifyHandle;
use crate::AioContext;
use aio_core::EventLoop;

/// Why a task gave no output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// [`JoinHandle::abort`] dropped it before it finished.
    #[error("the task was aborted")]
    Aborted,
    /// It panicked (the message, if the panic carried one); the loop and the other tasks go
    /// on.
    #[error("the task panicked: {0}")]
    Panicked(String),
    /// The context was dropped with the task unfinished.
    #[error("the context was dropped before the task finished")]
    ContextDropped,
}

aio_core::kit::io_error_from!(JoinError, |_| std::io::ErrorKind::Other);

/// The output slot a task and its handle share.
struct JoinState<T> {
    output: Option<Result<T, JoinError>>,
    waker: Option<Waker>,
}

/// Writes the task's end into the shared slot, whatever the end is (including being dropped
/// unfinished, with the context).
struct Finish<T> {
    state: Rc<RefCell<JoinState<T>>>,
}

impl<T> Finish<T> {
    fn set(&self, output: Result<T, JoinError>) {
        let waker = {
            let mut st = self.state.borrow_mut();
            if st.output.is_none() {
                st.output = Some(output);
            }
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for Finish<T> {
    fn drop(&mut self) {
        if self.state.borrow().output.is_none() {
            self.set(Err(JoinError::ContextDropped));
        }
    }
}

/// A spawned task: its future, and where its end goes.
struct Spawned<F: Future> {
    future: F,
    finish: Finish<F::Output>,
}

impl<F: Future> Future for Spawned<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: `future` is pinned structurally: it is never moved out of `self` nor
        // through `&mut` (`Spawned` has no `Drop`, no `Unpin` impl beyond the automatic one,
        // and no method other than this one touches it), so the pin of `self` carries over
        // to it. `finish` is not pinned and is only used through a shared reference.
        let (future, finish) = unsafe {
            let this = self.get_unchecked_mut();
            (Pin::new_unchecked(&mut this.future), &this.finish)
        };
        match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(out)) => finish.set(Ok(out)),
            Err(payload) => finish.set(Err(JoinError::Panicked(panic_message(payload)))),
        }
        Poll::Ready(())
    }
}

/// The handle of a spawned task: a future of its output, and [`abort`](JoinHandle::abort).
/// Dropping the handle detaches the task (it runs on).
///
/// `!Send`: tasks are `!Send` futures of one loop thread, and so is the slot their output
/// goes to (an `Rc`); other threads reach the loop through an [`IoThreadHandle`](crate::IoThreadHandle).
pub struct JoinHandle<T> {
    state: Rc<RefCell<JoinState<T>>>,
    executor: Weak<Executor>,
    id: u64,
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("id", &self.id)
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl<T> JoinHandle<T> {
    /// Whether the task has ended (finished, panicked, aborted or dropped).
    pub fn is_finished(&self) -> bool {
        self.state.borrow().output.is_some()
    }

    /// Drops the task's future now (or, if the task is running further up the stack, when its
    /// poll returns); the handle then yields [`JoinError::Aborted`]. What the future held is
    /// dropped as for any future: an engine request in flight is cancelled where the engine
    /// can, and its memory is freed only after the kernel or worker is done with it.
    pub fn abort(&self) {
        if self.is_finished() {
            return;
        }
        self.state.borrow_mut().output = Some(Err(JoinError::Aborted));
        if let Some(executor) = self.executor.upgrade() {
            executor.abort(self.id);
        }
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.state.borrow_mut();
        match st.output.take() {
            Some(out) => Poll::Ready(out),
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The message of a panic payload (a task's, an iothread closure's).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => s.to_string(),
            Err(_) => "a panic without a message".into(),
        },
    }
}

/// The waker of `block_on`: a flag, and a notify of the loop it runs (from any thread).
struct BlockOnWaker {
    woken: AtomicBool,
    notify: NotifyHandle,
}

impl Wake for BlockOnWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.notify.notify();
    }
}

impl<L: EventLoop + 'static> AioContext<L> {
    /// The context's executor, created with its bottom half on first use.
    fn executor(&self) -> Rc<Executor> {
        let mut slot = self.executor_slot().borrow_mut();
        if let Some(e) = slot.as_ref() {
            return e.clone();
        }
        let weak: Rc<RefCell<Weak<Executor>>> = Rc::default();
        let w = weak.clone();
        // Re-entrant: a task that runs a nested loop must not stop the others (nor itself,
        // once it is pending again) from being polled inside it.
        let bh = self.bh_new_reentrant(move |ctx| {
            let executor = w.borrow().upgrade();
            if let Some(executor) = executor {
                current::enter(ctx, || executor.run_ready());
            }
        });
        let executor = Executor::new(bh);
        *weak.borrow_mut() = Rc::downgrade(&executor);
        *slot = Some(executor.clone());
        drop(slot);
        // The end-of-iteration run of tasks woken during it (see `Executor::run_woken_now`).
        let w = Rc::downgrade(&executor);
        self.set_woken_task_runner(Rc::new(move |ctx: &AioContext<L>| {
            w.upgrade()
                .is_some_and(|e| current::enter(ctx, || e.run_woken_now()))
        }));
        executor
    }

    /// Spawns `future` as a task of this context: it is polled by the loop, on this thread,
    /// whenever it is woken (first right away, in the next iteration). The output comes out of
    /// the returned [`JoinHandle`]; a panic in the task ends that task only and comes out as
    /// [`JoinError::Panicked`].
    pub fn spawn<T: 'static>(&self, future: impl Future<Output = T> + 'static) -> JoinHandle<T> {
        let state = Rc::new(RefCell::new(JoinState {
            output: None,
            waker: None,
        }));
        let task = Spawned {
            future,
            finish: Finish {
                state: state.clone(),
            },
        };
        let executor = self.executor();
        let id = executor.spawn(Box::pin(task));
        JoinHandle {
            state,
            executor: Rc::downgrade(&executor),
            id,
        }
    }

    /// Spawns `future` as a task nobody waits for: as [`spawn`](AioContext::spawn) with its
    /// handle dropped at once, without the handle's shared slot (one allocation less per
    /// task, for a task per request). A panic ends the task only; the panic hook has reported
    /// it, and nothing else will.
    pub fn spawn_detached(&self, future: impl Future<Output = ()> + 'static) {
        self.executor().spawn(Box::pin(future));
    }

    /// Polls `future` to its end on this thread, running the loop (`poll(true)`) while it is
    /// pending, and returns its output. Callable from anywhere on the loop's thread: in
    /// `main`, inside a callback or a task (a nested loop), where it delivers completions and
    /// runs other tasks while it waits.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let waker = Arc::new(BlockOnWaker {
            woken: AtomicBool::new(true),
            notify: self.notify_handle(),
        });
        let as_waker = Waker::from(waker.clone());
        let mut cx = Context::from_waker(&as_waker);
        // Boxed so that it can be dropped inside the context, where what it holds (a timer, a
        // watched fd) can unregister itself.
        let mut future = Box::pin(future);
        loop {
            if waker.woken.swap(false, Ordering::AcqRel) {
                let polled = current::enter(self, || future.as_mut().poll(&mut cx));
                if let Poll::Ready(out) = polled {
                    current::enter(self, || drop(future));
                    return out;
                }
                continue;
            }
            self.poll(true);
        }
    }

    /// Tasks spawned on this context and not ended yet.
    pub fn task_count(&self) -> usize {
        self.executor_slot()
            .borrow()
            .as_ref()
            .map_or(0, |e| e.len())
    }

    /// Task polls so far (each wake that found its task costs one).
    pub fn task_polls(&self) -> u64 {
        self.executor_slot()
            .borrow()
            .as_ref()
            .map_or(0, |e| e.polls())
    }
}
