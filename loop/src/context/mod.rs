//! The loop: [`AioContext`], QEMU's `AioContext` over any [`EventLoop`].
//!
//! The loop is split by concern, as QEMU splits `aio-posix.c`, `async.c` and `qemu-timer.c`,
//! and each concern in two: the part the [`AioContext`] struct holds (a table, a queue, a
//! state), which never names the context (a table of callbacks is generic over their argument
//! `C`, and `mod.rs` keeps it as `...<AioContext<L>>`), and the context's calls on it
//! (`impl AioContext` blocks), which name both and which `mod.rs` never imports. No file
//! imports one that imports it back (`scripts/check-cycles.py loop`).
//!
//! | concern | the part | the context's calls | QEMU |
//! | --- | --- | --- | --- |
//! | the context | `mod.rs`: the [`AioContext`] struct, its construction and drop | `mod.rs` | `aio_context_new` |
//! | one iteration | `iteration_state.rs`: what iterations share | `iteration.rs`: timeout, wait, dispatch order | `aio_poll` (`aio-posix.c`) |
//! | fd handlers | `handler_table.rs`: the table, each handler's callbacks and polling mode | `handlers.rs`: [`FdHandler`](crate::FdHandler), `set_fd_handler` and its kin | `aio_set_fd_handler` |
//! | busy polling | `poll_state.rs`: parameters, window, poll set | `busy_poll.rs`: the spin, polling mode, the window's learning | `try_poll_mode`, `poll_set_started` |
//! | bottom halves | `bh_table.rs`: schedule state, [`BottomHalf`], loop-side table; `bh_queue.rs`: the queue that carries schedules to the loop thread | `bottom_half.rs`: `bh_new` and its kin, running them | `async.c` |
//! | deferred calls | `defer.rs`: defer sections and the calls pending in them | `mod.rs` | `defer-call.c` |
//! | timers | `timer_table.rs`: timers and their deadline order | `timers.rs`: `timer_new` and its kin, running the expired ones | `qemu-timer.c` |
//! | wake-ups | `shared.rs`: [`NotifyHandle`] and what other threads share; `wakeup.rs`: the notify_me handshake | `notify.rs`: `notify`, `notify_handle` | `aio_notify`, `ctx->notify_me` |
//! | counters | `counters.rs`: [`LoopCounters`] | `counting.rs`: the snapshot, `count` | trace points |
//!
//! The callbacks the tables keep (`LoopCallback<C>`, in two re-entrancy modes) are
//! `callback.rs`'s, a leaf.
//!
//! Tasks (`spawn`, `block_on`) are the `task` module's; the context only keeps their executor.
//!
//! The context does not know which monitor it runs on and never issues fd-monitor syscalls
//! itself, only through the [`EventLoop`] trait. The re-entrancy rules are on [`AioContext`]
//! itself, where users read them.

mod bh_queue;
pub(crate) mod bh_table;
mod bottom_half;
mod busy_poll;
mod callback;
mod counters;
mod counting;
mod defer;
mod handler_table;
pub(crate) mod handlers;
mod iteration;
mod iteration_state;
mod notify;
mod poll_state;
pub(crate) mod shared;
pub(crate) mod timer_table;
mod timers;
mod wakeup;

use std::cell::RefCell;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

pub use bh_table::{BottomHalf, IDLE_BH_DELAY_NS};
pub use counters::LoopCounters;
pub use defer::{DeferSection, DeferredCall};
pub use shared::NotifyHandle;
pub use timer_table::TimerId;

use bh_table::BhTable;
use defer::DeferState;
use handler_table::HandlerTable;
use iteration_state::IterationState;
use poll_state::BusyPoll;
use shared::{Shared, CONTEXT_NOTIFIER};
use timer_table::TimerTable;
use wakeup::Wakeup;

use crate::clock::{Clock, MonotonicClock};
use crate::task::executor::Executor;
use aio_core::AioError;
use aio_core::Notifier;
use aio_core::{EventLoop, Interest};

/// The event loop: fd handlers, bottom halves, timers, cross-thread notify and adaptive busy
/// polling over a pluggable [`EventLoop`] monitor.
///
/// # Re-entrancy
///
/// Every method takes `&self` and no borrow of the context's tables is held while a callback
/// runs, so a callback may add, change or remove any handler (itself included), schedule or
/// cancel bottom halves, arm timers, and call [`AioContext::poll`] again (a nested loop). A
/// callback is never re-entered: a nested `poll()` skips the handler, bottom half or timer whose
/// callback is running further up the stack, and leaves its work for later (level-triggered fds
/// are reported again; a bottom half's schedule is kept).
///
/// The context is `!Send`: create it on the thread that runs it. Other threads talk to it through
/// [`NotifyHandle`] and [`BottomHalf`], which are `Send + Sync`.
///
/// ```no_run
/// # fn demo<L: aio_core::EventLoop>(monitor: L) -> Result<(), aio_core::AioError> {
/// use aio_loop::AioContext;
/// let ctx = AioContext::new(monitor)?;
/// let bh = ctx.bh_new(|_ctx| println!("bottom half ran"));
/// bh.schedule();
/// while ctx.poll(false) {}
/// # Ok(()) }
/// ```
pub struct AioContext<L: EventLoop> {
    monitor: RefCell<L>,
    /// What other threads reach: the notifier, the notify_me handshake, the bottom-half queue.
    shared: Arc<Shared>,
    clock: Box<dyn Clock>,
    handlers: RefCell<HandlerTable<AioContext<L>>>,
    bottom_halves: BhTable<AioContext<L>>,
    timers: RefCell<TimerTable<AioContext<L>>>,
    busy_poll: BusyPoll,
    /// Defer sections and the calls pending in them (QEMU's `defer_call()`).
    defer: Rc<DeferState>,
    tasks: Tasks<L>,
    iteration: IterationState,
    counters: RefCell<LoopCounters>,
}

/// The tasks of [`AioContext::spawn`]: their executor, created on first use, and what polls
/// the tasks woken during an iteration at its end (set with the executor).
struct Tasks<L: EventLoop> {
    executor: RefCell<Option<Rc<Executor>>>,
    woken_runner: RefCell<Option<Rc<WokenTaskRunner<L>>>>,
}

/// See [`Tasks`].
type WokenTaskRunner<L> = dyn Fn(&AioContext<L>) -> bool;

impl<L: EventLoop> fmt::Debug for AioContext<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AioContext")
            .field("monitor", &self.monitor.borrow().describe())
            .field("handlers", &self.handlers.borrow().len())
            .field("counters", &*self.counters.borrow())
            .finish_non_exhaustive()
    }
}

impl<L: EventLoop> AioContext<L> {
    /// A context over `monitor` with the monotonic clock and polling off.
    pub fn new(monitor: L) -> Result<Self, AioError> {
        Self::with_clock(monitor, Box::new(MonotonicClock))
    }

    /// A context over `monitor` reading time from `clock` (tests use a
    /// [`FakeClock`](crate::FakeClock)).
    pub fn with_clock(mut monitor: L, clock: Box<dyn Clock>) -> Result<Self, AioError> {
        let notifier = Notifier::new().map_err(AioError::Notifier)?;
        monitor
            .register(notifier.as_fd(), CONTEXT_NOTIFIER, Interest::READABLE)
            .map_err(|source| AioError::Monitor {
                monitor: monitor.name(),
                op: "register",
                fd: notifier.as_raw_fd(),
                source,
            })?;
        Ok(AioContext {
            monitor: RefCell::new(monitor),
            shared: Arc::new(Shared {
                notifier,
                wakeup: Wakeup::new(),
                notifier_writes: AtomicU64::new(0),
                notify_calls: AtomicU64::new(0),
                bh_queue: Default::default(),
                loop_thread: std::thread::current().id(),
            }),
            clock,
            handlers: RefCell::new(HandlerTable::new()),
            bottom_halves: BhTable::new(),
            timers: RefCell::new(TimerTable::new()),
            busy_poll: BusyPoll::new(),
            defer: Rc::default(),
            tasks: Tasks {
                executor: RefCell::new(None),
                woken_runner: RefCell::new(None),
            },
            iteration: IterationState::default(),
            counters: RefCell::new(LoopCounters::default()),
        })
    }

    /// The monitor's name (`"poll"`, `"epoll"`, ...).
    pub fn monitor_name(&self) -> &'static str {
        self.monitor.borrow().name()
    }

    /// The monitor's description (the hybrid says which side is active).
    pub fn describe_monitor(&self) -> String {
        self.monitor.borrow().describe()
    }

    /// Runs `f` with the monitor (for monitor-specific statistics). `f` must not call back
    /// into the context.
    pub fn with_monitor<R>(&self, f: impl FnOnce(&L) -> R) -> R {
        f(&self.monitor.borrow())
    }

    /// Which kernel object the context's own notifier is (an eventfd, or the pipe fallback).
    pub fn notifier_kind(&self) -> aio_core::NotifierKind {
        self.shared.notifier.kind()
    }

    /// The context's clock, in ns.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Where the executor of [`AioContext::spawn`] lives (`task` module).
    pub(crate) fn executor_slot(&self) -> &RefCell<Option<Rc<Executor>>> {
        &self.tasks.executor
    }

    /// Sets what runs the woken tasks at the end of each iteration (`task` module).
    pub(crate) fn set_woken_task_runner(&self, runner: Rc<WokenTaskRunner<L>>) {
        *self.tasks.woken_runner.borrow_mut() = Some(runner);
    }

    /// Polls the tasks woken so far (a task just spawned is woken) now, instead of at the end
    /// of the loop's iteration; returns whether any ran. For a caller that holds a batch open
    /// (an engine's [`plug`](crate::attached::AttachedEngine::plug)) while it spawns work: the
    /// tasks take their first steps inside the batch, so the requests they submit go with it
    /// (what the engine's completion delivery does for the tasks its completions wake).
    /// Callable from a callback or a task; a task being polled up the stack is skipped, and
    /// polled again later if it was woken.
    pub fn run_woken_tasks(&self) -> bool {
        let runner = self.tasks.woken_runner.borrow().clone();
        runner.is_some_and(|r| r(self))
    }

    /// Whether a `poll()` of this context is running (the caller is inside one of its
    /// callbacks).
    pub fn is_polling(&self) -> bool {
        self.iteration.depth.get() > 0
    }

    /// A call that runs once at the end of the batch it is called in (QEMU's
    /// `defer_call()`): inside a defer section (every delivery of an engine's completions is
    /// one), [`DeferredCall::call`] marks it, and it runs once when the outermost section
    /// ends; outside, it runs at once. See the `defer` rules on [`DeferredCall`].
    ///
    /// ```no_run
    /// # fn demo<L: aio_core::EventLoop>(ctx: &aio_loop::AioContext<L>) {
    /// // A virtqueue's interrupt, raised once per batch of completions.
    /// let raise_irq = ctx.deferred_call(|| println!("interrupt"));
    /// let section = ctx.defer_section();
    /// raise_irq.call();
    /// raise_irq.call();
    /// drop(section); // "interrupt", once
    /// # }
    /// ```
    pub fn deferred_call(&self, f: impl FnMut() + 'static) -> DeferredCall {
        self.defer.new_call(Box::new(f))
    }

    /// Opens a defer section (QEMU's `defer_call_begin()`); dropping the guard ends it, and
    /// the outermost end runs the calls deferred meanwhile. Sections nest.
    pub fn defer_section(&self) -> DeferSection {
        self.defer.begin()
    }
}

impl<L: EventLoop> Drop for AioContext<L> {
    fn drop(&mut self) {
        // Unfinished tasks first, while everything their futures hold still works (an engine
        // future's drop cancels its request; the engine's drop waits for the kernel).
        self.tasks.woken_runner.get_mut().take();
        if let Some(executor) = self.tasks.executor.get_mut().take() {
            executor.clear();
        }
        // Mark every bottom half deleted so handles held by other threads stop scheduling.
        self.bottom_halves.mark_all_deleted();
    }
}

#[cfg(test)]
mod bottom_half_tests;
#[cfg(test)]
mod handler_tests;
#[cfg(test)]
mod iteration_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wakeup_tests;
