//! `IoThread`: a named thread that owns a context and what it serves, QEMU's IOThread object.
//!
//! This module owns the thread's life (build on the thread, run the loop, stop, join) and the
//! queue of closures other threads send it. It never touches the loop's internals: closures
//! run in a bottom half of the thread's own context.

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, ThreadId};

use crate::context::bh_table::BottomHalf;
use crate::task::panic_message;
use crate::{AioContext, LoopCounters, PollParams};
use aio_core::EventLoop;

/// A closure sent to the thread.
type Job<L, S> = Box<dyn FnOnce(&AioContext<L>, &S) + Send>;

/// Why an iothread could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoThreadError {
    /// The build closure failed (its error's message), or the thread could not start.
    #[error("iothread {name}: {reason}")]
    Build {
        /// The thread's name.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// The thread is stopping or stopped: the closure was not accepted.
    #[error("iothread {name} is stopped")]
    Stopped {
        /// The thread's name.
        name: String,
    },
    /// The closure panicked (the panic's message); the thread goes on.
    #[error("a closure on iothread {name} panicked: {message}")]
    Panicked {
        /// The thread's name.
        name: String,
        /// The panic's message.
        message: String,
    },
    /// [`IoThreadHandle::call`] from the iothread itself, which would wait for itself.
    #[error("call() on iothread {name} from that same thread would wait for itself")]
    WouldDeadlock {
        /// The thread's name.
        name: String,
    },
}

aio_core::kit::io_error_from!(IoThreadError, |e| match e {
    IoThreadError::Build { .. } => std::io::ErrorKind::Other,
    IoThreadError::Stopped { .. } => std::io::ErrorKind::BrokenPipe,
    IoThreadError::Panicked { .. } => std::io::ErrorKind::Other,
    IoThreadError::WouldDeadlock { .. } => std::io::ErrorKind::Deadlock,
});

/// The queue other threads fill.
struct Queue<L: EventLoop, S> {
    jobs: VecDeque<Job<L, S>>,
    /// No new closures: the thread runs what is queued and exits.
    stopping: bool,
}

/// What the handles and the thread share.
struct Inner<L: EventLoop, S> {
    name: String,
    queue: Mutex<Queue<L, S>>,
    /// The bottom half that runs the queue (set once the thread is built).
    bh: Mutex<Option<BottomHalf>>,
    panics: Mutex<Vec<String>>,
    thread: Mutex<Option<ThreadId>>,
}

impl<L: EventLoop, S> Inner<L, S> {
    fn queue(&self) -> MutexGuard<'_, Queue<L, S>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn kick(&self) {
        if let Some(bh) = self
            .bh
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            bh.schedule();
        }
    }

    fn stopped(&self) -> IoThreadError {
        IoThreadError::Stopped {
            name: self.name.clone(),
        }
    }
}

/// A handle of an [`IoThread`]: `Send + Sync + Clone` (a shared queue and the thread's
/// bottom-half handle), for any thread to send work to the iothread.
pub struct IoThreadHandle<L: EventLoop, S> {
    inner: Arc<Inner<L, S>>,
    _types: PhantomData<fn() -> (L, S)>,
}

impl<L: EventLoop, S> Clone for IoThreadHandle<L, S> {
    fn clone(&self) -> Self {
        IoThreadHandle {
            inner: self.inner.clone(),
            _types: PhantomData,
        }
    }
}

impl<L: EventLoop, S> fmt::Debug for IoThreadHandle<L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoThreadHandle")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl<L: EventLoop + 'static, S: 'static> IoThreadHandle<L, S> {
    /// The thread's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Runs `f` on the iothread, with its context and state, and returns at once. A panic in
    /// `f` is kept for [`take_panics`](IoThreadHandle::take_panics).
    pub fn run(
        &self,
        f: impl FnOnce(&AioContext<L>, &S) + Send + 'static,
    ) -> Result<(), IoThreadError> {
        let mut q = self.inner.queue();
        if q.stopping {
            return Err(self.inner.stopped());
        }
        q.jobs.push_back(Box::new(f));
        drop(q);
        self.inner.kick();
        Ok(())
    }

    /// Runs `f` on the iothread and waits for its result (a panic in `f` is
    /// [`IoThreadError::Panicked`]). Refused from the iothread itself.
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&AioContext<L>, &S) -> R + Send + 'static,
    ) -> Result<R, IoThreadError> {
        let on_thread = *self
            .inner
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if on_thread == Some(std::thread::current().id()) {
            return Err(IoThreadError::WouldDeadlock {
                name: self.inner.name.clone(),
            });
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.run(move |ctx, state| {
            let outcome = catch_unwind(AssertUnwindSafe(|| f(ctx, state)));
            let _ = tx.send(outcome.map_err(panic_message));
        })?;
        match rx.recv() {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(IoThreadError::Panicked {
                name: self.inner.name.clone(),
                message,
            }),
            // The thread died (a panic outside any closure) before running it.
            Err(_) => Err(self.inner.stopped()),
        }
    }

    /// A bottom half of the iothread's context running `f`; schedule it from any thread.
    pub fn bh_new(
        &self,
        f: impl FnMut(&AioContext<L>) + Send + 'static,
    ) -> Result<BottomHalf, IoThreadError> {
        self.call(move |ctx, _| ctx.bh_new(f))
    }

    /// Sets the iothread's adaptive-polling parameters (QEMU's per-IOThread `poll-max-ns`).
    pub fn set_poll_params(&self, params: PollParams) -> Result<(), IoThreadError> {
        self.run(move |ctx, _| ctx.set_poll_params(params))
    }

    /// The iothread's loop counters, read on the thread.
    pub fn counters(&self) -> Result<LoopCounters, IoThreadError> {
        self.call(|ctx, _| ctx.counters())
    }

    /// The messages of panics in fire-and-forget closures since the last call.
    pub fn take_panics(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .inner
                .panics
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

/// An iothread: a named thread running one [`AioContext`] and the state `S` it serves,
/// stopped and joined by [`IoThread::stop`] or on drop. `Send + Sync` (a handle and a join
/// handle); share it, or its [`IoThreadHandle`]s, with any thread.
///
/// * **Built on its thread.** A closure builds the context, its monitor and whatever the
///   thread serves (an attached engine, disks) on the new thread, so `!Send` engines and
///   monitors work; [`IoThread::spawn`] returns once it is built, or with the build's error.
/// * **Handles cross threads.** [`IoThreadHandle`] is `Send + Sync + Clone`: it runs closures
///   on the thread (fire-and-forget, or waiting for a result), creates bottom halves that any
///   thread schedules, sets poll parameters, reads the loop's counters. Closures from one
///   sender run in the order it sent them.
/// * **Panics are reported, not lost.** A panic in a closure ends that closure only: a waiting
///   caller gets [`IoThreadError::Panicked`], a fire-and-forget one is kept for
///   [`IoThreadHandle::take_panics`]; the loop and the other iothreads go on.
/// * **Stop runs what is scheduled.** [`IoThread::stop`] (or dropping the `IoThread`) refuses
///   new closures, runs every closure already accepted, then drops the thread's state and
///   context (an engine's drop waits for its requests) and joins the thread.
pub struct IoThread<L: EventLoop + 'static, S: 'static> {
    handle: IoThreadHandle<L, S>,
    thread: Option<JoinHandle<()>>,
}

impl<L: EventLoop + 'static, S: 'static> fmt::Debug for IoThread<L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoThread")
            .field("name", &self.handle.inner.name)
            .finish_non_exhaustive()
    }
}

impl<L: EventLoop + 'static, S: 'static> IoThread<L, S> {
    /// Starts a thread named `name` and builds its context and state there with `build`;
    /// returns once it is built and its loop runs, or with the build's error.
    pub fn spawn<E: fmt::Display>(
        name: &str,
        build: impl FnOnce() -> Result<(AioContext<L>, S), E> + Send + 'static,
    ) -> Result<Self, IoThreadError> {
        let inner = Arc::new(Inner {
            name: name.to_string(),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                stopping: false,
            }),
            bh: Mutex::new(None),
            panics: Mutex::new(Vec::new()),
            thread: Mutex::new(None),
        });
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), String>>(1);
        let shared = inner.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let (ctx, state) = match build() {
                    Ok(built) => built,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                serve(&shared, ctx, state, ready_tx);
            })
            .map_err(|e| IoThreadError::Build {
                name: name.to_string(),
                reason: format!("the thread could not start: {e}"),
            })?;
        let built = ready_rx
            .recv()
            .unwrap_or_else(|_| Err("the thread ended (a panic) before it was built".to_string()));
        if let Err(reason) = built {
            let _ = thread.join();
            return Err(IoThreadError::Build {
                name: name.to_string(),
                reason,
            });
        }
        Ok(IoThread {
            handle: IoThreadHandle {
                inner,
                _types: PhantomData,
            },
            thread: Some(thread),
        })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> IoThreadHandle<L, S> {
        self.handle.clone()
    }

    /// Refuses new closures, runs the ones already accepted, drops the state and the context
    /// on the thread, and joins it. An error says the thread itself panicked (outside any
    /// closure: in a callback of its loop).
    pub fn stop(mut self) -> Result<(), IoThreadError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), IoThreadError> {
        self.handle.inner.queue().stopping = true;
        self.handle.inner.kick();
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(payload)) => Err(IoThreadError::Panicked {
                name: self.handle.inner.name.clone(),
                message: panic_message(payload),
            }),
            _ => Ok(()),
        }
    }
}

impl<L: EventLoop + 'static, S: 'static> std::ops::Deref for IoThread<L, S> {
    type Target = IoThreadHandle<L, S>;
    fn deref(&self) -> &IoThreadHandle<L, S> {
        &self.handle
    }
}

impl<L: EventLoop + 'static, S: 'static> Drop for IoThread<L, S> {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// The thread's life once built: the queue's bottom half, the loop until stopped, the
/// queue's last closures, then the state and the context dropped in that order.
fn serve<L: EventLoop + 'static, S: 'static>(
    shared: &Arc<Inner<L, S>>,
    ctx: AioContext<L>,
    state: S,
    ready: mpsc::SyncSender<Result<(), String>>,
) {
    /// Marks the queue stopped however the thread ends (a panic in a loop callback too), so
    /// that later closures are refused instead of waiting forever.
    struct Ended<'a, L: EventLoop, S>(&'a Inner<L, S>);
    impl<L: EventLoop, S> Drop for Ended<'_, L, S> {
        fn drop(&mut self) {
            self.0.queue().stopping = true;
            // Closures accepted but never run: their senders (a `call`) see the thread gone.
            let left = std::mem::take(&mut self.0.queue().jobs);
            drop(left);
        }
    }
    let _ended = Ended(shared);
    *shared.thread.lock().unwrap_or_else(PoisonError::into_inner) =
        Some(std::thread::current().id());
    let state = Rc::new(state);
    let stop = Rc::new(std::cell::Cell::new(false));
    let (st, stop_flag, inner) = (state.clone(), stop.clone(), shared.clone());
    let bh = ctx.bh_new(move |ctx| {
        let (jobs, stopping) = {
            let mut q = inner.queue();
            (std::mem::take(&mut q.jobs), q.stopping)
        };
        for job in jobs {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job(ctx, &st))) {
                inner
                    .panics
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(panic_message(payload));
            }
        }
        // `stopping` was read with the jobs: nothing can be queued after it.
        if stopping {
            stop_flag.set(true);
        }
    });
    *shared.bh.lock().unwrap_or_else(PoisonError::into_inner) = Some(bh.clone());
    // Closures sent before the bottom half existed.
    bh.schedule();
    let _ = ready.send(Ok(()));
    while !stop.get() {
        ctx.poll(true);
    }
    *shared.bh.lock().unwrap_or_else(PoisonError::into_inner) = None;
    bh.delete();
    drop(state);
    drop(ctx);
}
