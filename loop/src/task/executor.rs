//! The executor inside a context: spawned tasks, their wakers, and the bottom half that polls
//! them.
//!
//! This module owns the task table, the queue of woken tasks and the wake rule. It never
//! blocks and never waits: a woken task is polled by the context's bottom half, in whatever
//! iteration (or nested `poll()`) runs it.
//!
//! * A waker is `Send + Sync`. Waking pushes the task's id on a queue and schedules the
//!   executor's bottom half, so a wake from another thread goes through the context's notify
//!   path and its notify_me rule (the eventfd is written only if the loop is blocked).
//! * A task is queued at most once at a time (a flag per task): a thousand wakes before the
//!   next poll cost one poll.
//! * A task is taken out of its slot while it is polled, so a nested `poll()` from inside it
//!   (a `block_on` in a callback) never polls it again; a wake that arrives meanwhile is kept
//!   and the task is polled again once the outer poll has returned.
//! * A panic in a task ends that task only: its [`JoinHandle`](super::JoinHandle) reports it.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use crate::context::bh_table::BottomHalf;
use aio_core::kit::{SlotId, Slots};

type TaskFuture = Pin<Box<dyn Future<Output = ()>>>;

/// What other threads share with the executor: the woken tasks and the bottom half that
/// polls them.
pub(crate) struct ReadyQueue {
    queue: Mutex<Vec<u64>>,
    bh: BottomHalf,
}

impl ReadyQueue {
    fn push(&self, id: u64) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
        self.bh.schedule();
    }

    fn is_empty(&self) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One task's waker.
struct TaskWaker {
    id: u64,
    /// Queued and not yet polled.
    queued: AtomicBool,
    ready: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.push(self.id);
        }
    }
}

/// A task in the table.
struct Task {
    /// None while it is being polled further up the stack.
    future: Option<TaskFuture>,
    waker: Arc<TaskWaker>,
    /// Woken while it was being polled: poll again when that poll returns.
    woken_while_running: bool,
    /// Aborted while it was being polled: drop it when that poll returns.
    aborted: bool,
}

/// The tasks of one context.
pub(crate) struct Executor {
    tasks: RefCell<Slots<Task>>,
    ready: Arc<ReadyQueue>,
    polls: Cell<u64>,
}

impl Executor {
    /// An executor whose tasks are polled by `bh` (scheduled on every wake).
    pub(crate) fn new(bh: BottomHalf) -> Rc<Self> {
        Rc::new(Executor {
            tasks: RefCell::new(Slots::new()),
            ready: Arc::new(ReadyQueue {
                queue: Mutex::new(Vec::new()),
                bh,
            }),
            polls: Cell::new(0),
        })
    }

    /// Adds a task and queues its first poll; returns its id.
    pub(crate) fn spawn(&self, future: TaskFuture) -> u64 {
        let mut tasks = self.tasks.borrow_mut();
        let id = tasks.next_id().to_u64();
        let waker = Arc::new(TaskWaker {
            id,
            queued: AtomicBool::new(false),
            ready: self.ready.clone(),
        });
        tasks.insert(Task {
            future: Some(future),
            waker: waker.clone(),
            woken_while_running: false,
            aborted: false,
        });
        drop(tasks);
        waker.wake_by_ref();
        id
    }

    /// Drops a task's future in the bottom half's next run (or, if the task is running
    /// further up the stack, when its poll returns), inside its context, so that what the
    /// future holds can unregister itself. Returns whether the task was still there.
    pub(crate) fn abort(&self, id: u64) -> bool {
        let mut tasks = self.tasks.borrow_mut();
        let Some(task) = tasks.get_mut(SlotId::from_u64(id)) else {
            return false;
        };
        task.aborted = true;
        let waker = task.waker.clone();
        drop(tasks);
        waker.wake_by_ref();
        true
    }

    /// Whether woken tasks wait to be polled.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Polls the woken tasks now, if any, and unschedules the bottom half when none are left
    /// (the loop's end-of-iteration run: a task woken by a completion callback runs in the
    /// iteration that delivered the completion, as QEMU enters a coroutine from its
    /// completion, instead of costing another iteration). Returns whether any ran.
    pub(crate) fn run_woken_now(&self) -> bool {
        if !self.has_ready() {
            return false;
        }
        self.run_ready();
        if !self.has_ready() {
            self.ready.bh.cancel();
        }
        true
    }

    /// Tasks alive (spawned and not finished or aborted).
    pub(crate) fn len(&self) -> usize {
        self.tasks.borrow().len()
    }

    /// Task polls so far.
    pub(crate) fn polls(&self) -> u64 {
        self.polls.get()
    }

    /// Polls every queued task once. Re-entrant: a nested call skips tasks being polled up
    /// the stack (and remembers their wakes).
    pub(crate) fn run_ready(&self) {
        for id in self.ready.take() {
            let slot = SlotId::from_u64(id);
            let (mut future, waker) = {
                let mut tasks = self.tasks.borrow_mut();
                let Some(task) = tasks.get_mut(slot) else {
                    continue;
                };
                // Cleared before the poll: a wake during the poll queues it again.
                task.waker.queued.store(false, Ordering::Release);
                if task.aborted && task.future.is_some() {
                    let removed = tasks.remove(slot);
                    drop(tasks);
                    // Dropped outside the borrow: a future's drop may spawn or abort.
                    drop(removed);
                    continue;
                }
                match task.future.take() {
                    Some(f) => (f, task.waker.clone()),
                    None => {
                        task.woken_while_running = true;
                        continue;
                    }
                }
            };
            self.polls.set(self.polls.get() + 1);
            let waker = Waker::from(waker);
            let mut cx = Context::from_waker(&waker);
            let outcome = catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
            let mut tasks = self.tasks.borrow_mut();
            let finished = !matches!(outcome, Ok(Poll::Pending));
            let Some(task) = tasks.get_mut(slot) else {
                continue;
            };
            if finished || task.aborted {
                let removed = tasks.remove(slot);
                drop(tasks);
                drop(removed);
                // A panic's payload is the task's own business: a spawned task's wrapper caught
                // it first for its JoinHandle (see `spawn`); a detached task's is dropped here.
                drop(outcome);
                drop(future);
                continue;
            }
            task.future = Some(future);
            if std::mem::take(&mut task.woken_while_running) {
                task.waker.wake_by_ref();
            }
        }
    }

    /// Drops every task (the context is going away).
    pub(crate) fn clear(&self) {
        let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
        drop(tasks);
    }
}
