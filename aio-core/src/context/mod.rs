//! The loop: [`AioContext`], QEMU's `AioContext` over any [`EventLoop`].
//!
//! This module owns the policy of an iteration: the wait timeout, busy polling and its
//! adaptation, the notify_me handshake with other threads, and the dispatch order (bottom halves,
//! fd handlers, timers). It does not know which monitor it runs on and never issues fd-monitor
//! syscalls itself, only through the [`EventLoop`] trait.
//!
//! The re-entrancy rules are on [`AioContext`] itself, where users read them.

mod bottom_half;
mod wakeup;

use wakeup::Wakeup;
mod handlers;
mod timers;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub use bottom_half::BottomHalf;
pub use handlers::FdHandler;
pub use timers::TimerId;

use bottom_half::{BhEntry, BhState, DELETE_TICKET};
use handlers::{HandlerTable, LoopCallback};
use timers::TimerTable;

use crate::clock::{Clock, MonotonicClock};
use crate::error::AioError;
use crate::event_loop::{Event, EventLoop, Interest, Token};
use crate::notifier::Notifier;
use crate::polling::{PollParams, PollWindow, WindowChange, DEFAULT_POLL_IDLE_NS};
use crate::sys::fd_is_open;

/// The token of the context's own notifier in the monitor (never a handler's token: handler
/// tokens have a generation >= 1 in their high half and an index < 2^32 - 1 in the low half).
const CONTEXT_NOTIFIER: Token = Token(u64::MAX);

/// What the loop has done, as plain numbers: tests and the bench read these to see *why* a
/// figure is what it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopCounters {
    /// Calls of `poll()`, nested ones included.
    pub iterations: u64,
    /// Monitor waits with a non-zero timeout (the loop may have slept).
    pub blocking_waits: u64,
    /// Monitor waits with a zero timeout.
    pub nonblocking_waits: u64,
    /// Iterations that skipped the monitor entirely because busy polling found work and every
    /// handler is covered by polling.
    pub waits_skipped: u64,
    /// Waits interrupted by a signal (`EINTR`) and retried.
    pub wait_retries: u64,
    /// Waits that failed with another error (the iteration made no fd progress).
    pub wait_errors: u64,
    /// Writes to the context notifier by `notify()` (only while the loop was, or was about to
    /// be, blocked: notify_me).
    pub notifier_writes: u64,
    /// Calls of `notify()`, written or not.
    pub notify_calls: u64,
    /// Busy-polling windows run.
    pub poll_attempts: u64,
    /// Busy-polling windows that found an `io_poll` handler ready (or a notification).
    pub poll_hits: u64,
    /// Time spent busy polling, in ns.
    pub busy_poll_ns: u64,
    /// The current polling window, in ns.
    pub poll_ns: u64,
    /// Handlers busy polling checks now.
    pub poll_set: u64,
    /// Handlers busy polling does not cover now (no `io_poll`, idle, or closed); they are
    /// still served by the monitor.
    pub unpolled_handlers: u64,
    /// Times a handler left the poll set because it was idle for the idle interval.
    pub poll_idle_removals: u64,
    /// Times the polling window shrank (to 0 with the default `shrink`).
    pub poll_shrinks: u64,
    /// Probes of a collapsed window ([`PollRule::Recovering`](crate::PollRule)): one busy
    /// poll of `poll_max_ns` while the window is 0.
    pub poll_probes: u64,
    /// Probes that found the event, restoring the window to `poll_max_ns`.
    pub poll_probe_hits: u64,
    /// Bottom-half callbacks run.
    pub bh_runs: u64,
    /// Timer callbacks run.
    pub timer_runs: u64,
    /// Handler callbacks run (`io_read`, `io_write`, `io_poll_ready`).
    pub handler_calls: u64,
    /// Registered fds found closed (`POLLNVAL`) and taken out of the monitor.
    pub closed_fds: u64,
    /// The deepest nesting of `poll()` seen (1 = no nesting).
    pub max_nesting: u64,
}

impl LoopCounters {
    /// Adds another loop's counters to these, as for loops that ran side by side (a job's
    /// parallel clones): counts and handler totals add up; the polling window and the nesting
    /// depth keep the larger value.
    pub fn merge(&mut self, other: &LoopCounters) {
        // Destructured so that a new field cannot be forgotten here.
        let LoopCounters {
            iterations,
            blocking_waits,
            nonblocking_waits,
            waits_skipped,
            wait_retries,
            wait_errors,
            notifier_writes,
            notify_calls,
            poll_attempts,
            poll_hits,
            busy_poll_ns,
            poll_ns,
            poll_set,
            unpolled_handlers,
            poll_idle_removals,
            poll_shrinks,
            poll_probes,
            poll_probe_hits,
            bh_runs,
            timer_runs,
            handler_calls,
            closed_fds,
            max_nesting,
        } = *other;
        self.iterations += iterations;
        self.blocking_waits += blocking_waits;
        self.nonblocking_waits += nonblocking_waits;
        self.waits_skipped += waits_skipped;
        self.wait_retries += wait_retries;
        self.wait_errors += wait_errors;
        self.notifier_writes += notifier_writes;
        self.notify_calls += notify_calls;
        self.poll_attempts += poll_attempts;
        self.poll_hits += poll_hits;
        self.busy_poll_ns += busy_poll_ns;
        self.poll_ns = self.poll_ns.max(poll_ns);
        self.poll_set += poll_set;
        self.unpolled_handlers += unpolled_handlers;
        self.poll_idle_removals += poll_idle_removals;
        self.poll_shrinks += poll_shrinks;
        self.poll_probes += poll_probes;
        self.poll_probe_hits += poll_probe_hits;
        self.bh_runs += bh_runs;
        self.timer_runs += timer_runs;
        self.handler_calls += handler_calls;
        self.closed_fds += closed_fds;
        self.max_nesting = self.max_nesting.max(max_nesting);
    }
}

/// The part of a context that other threads reach.
pub(crate) struct Shared {
    notifier: Notifier,
    /// The notify_me handshake: only while the loop is (about to be) blocked does `notify()`
    /// write the notifier.
    wakeup: Wakeup,
    notifier_writes: AtomicU64,
    notify_calls: AtomicU64,
    bh_queue: Mutex<Vec<BhEntry>>,
    /// The thread that runs the loop: a bottom half scheduled from it needs no wake-up.
    loop_thread: std::thread::ThreadId,
}

impl Shared {
    pub(crate) fn notify(&self) {
        self.notify_calls.fetch_add(1, Ordering::Relaxed);
        // Either the loop sees the notification (or the queued bottom half) before it sleeps,
        // or we see it about to sleep and write (see `wakeup`).
        if self.wakeup.notify() {
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

    pub(crate) fn push_bh(&self, entry: BhEntry) {
        self.bh_queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    fn take_bh_queue(&self) -> Vec<BhEntry> {
        std::mem::take(&mut *self.bh_queue.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A `Send + Sync` handle that wakes a context from any thread.
#[derive(Clone)]
pub struct NotifyHandle {
    shared: Arc<Shared>,
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

struct BhSlot<L: EventLoop> {
    generation: u32,
    state: Arc<BhState>,
    callback: Rc<LoopCallback<L>>,
    oneshot: bool,
}

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
/// use aio_core::AioContext;
/// let ctx = AioContext::new(monitor)?;
/// let bh = ctx.bh_new(|_ctx| println!("bottom half ran"));
/// bh.schedule();
/// while ctx.poll(false) {}
/// # Ok(()) }
/// ```
pub struct AioContext<L: EventLoop> {
    monitor: RefCell<L>,
    shared: Arc<Shared>,
    clock: Box<dyn Clock>,
    handlers: RefCell<HandlerTable<L>>,
    bhs: RefCell<Vec<Option<BhSlot<L>>>>,
    bh_free: RefCell<Vec<u32>>,
    bh_next_generation: Cell<u32>,
    /// Schedules taken off the shared queue, one slice per `poll()` on the stack; a nested
    /// poll drains the outer slices too, oldest first (QEMU's `bh_slice_list`).
    bh_slices: RefCell<Vec<VecDeque<BhEntry>>>,
    /// Schedules of bottom halves whose callback is running further up the stack.
    bh_deferred: RefCell<Vec<BhEntry>>,
    timers: RefCell<TimerTable<L>>,
    params: Cell<PollParams>,
    window: Cell<PollWindow>,
    poll_idle_ns: Cell<u64>,
    counters: RefCell<LoopCounters>,
    depth: Cell<u32>,
    dispatch_seq: Cell<u64>,
    event_buffers: RefCell<Vec<Vec<Event>>>,
    last_wait_error: RefCell<Option<io::Error>>,
}

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
            .register(notifier.as_raw_fd(), CONTEXT_NOTIFIER, Interest::READABLE)
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
                bh_queue: Mutex::new(Vec::new()),
                loop_thread: std::thread::current().id(),
            }),
            clock,
            handlers: RefCell::new(HandlerTable::new()),
            bhs: RefCell::new(Vec::new()),
            bh_free: RefCell::new(Vec::new()),
            bh_next_generation: Cell::new(1),
            bh_slices: RefCell::new(Vec::new()),
            bh_deferred: RefCell::new(Vec::new()),
            timers: RefCell::new(TimerTable::new()),
            params: Cell::new(PollParams::default()),
            window: Cell::new(PollWindow::default()),
            poll_idle_ns: Cell::new(DEFAULT_POLL_IDLE_NS),
            counters: RefCell::new(LoopCounters {
                max_nesting: 0,
                ..LoopCounters::default()
            }),
            depth: Cell::new(0),
            dispatch_seq: Cell::new(0),
            event_buffers: RefCell::new(Vec::new()),
            last_wait_error: RefCell::new(None),
        })
    }

    // ----- monitor, clock, counters -------------------------------------------------------

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

    /// The context's clock, in ns.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Whether a `poll()` of this context is running (the caller is inside one of its
    /// callbacks).
    pub fn is_polling(&self) -> bool {
        self.depth.get() > 0
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> LoopCounters {
        let mut c = *self.counters.borrow();
        c.notifier_writes = self.shared.notifier_writes.load(Ordering::Relaxed);
        c.notify_calls = self.shared.notify_calls.load(Ordering::Relaxed);
        c.poll_ns = self.window.get().ns();
        let handlers = self.handlers.borrow();
        c.poll_set = handlers.poll_set.len() as u64;
        c.unpolled_handlers = handlers.unpolled() as u64;
        c
    }

    /// The last wait error other than `EINTR`, if the latest failing iteration had one.
    pub fn take_last_wait_error(&self) -> Option<io::Error> {
        self.last_wait_error.borrow_mut().take()
    }

    fn count(&self, f: impl FnOnce(&mut LoopCounters)) {
        f(&mut self.counters.borrow_mut());
    }

    // ----- adaptive polling parameters ---------------------------------------------------

    /// Sets the adaptive polling parameters; takes effect in the next iteration. Turning
    /// polling on starts the window at 4 µs; turning it off (max 0) resets the window to 0.
    pub fn set_poll_params(&self, params: PollParams) {
        self.params.set(params);
        let mut window = self.window.get();
        window.reset(&params);
        self.window.set(window);
    }

    /// The current adaptive polling parameters.
    pub fn poll_params(&self) -> PollParams {
        self.params.get()
    }

    /// Sets how long a handler may stay inactive before it leaves the poll set (default 7 s).
    pub fn set_poll_idle_interval(&self, interval: Duration) {
        self.poll_idle_ns
            .set(u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX));
    }

    // ----- cross-thread notify ----------------------------------------------------------

    /// Wakes the loop (see [`NotifyHandle::notify`]).
    pub fn notify(&self) {
        self.shared.notify();
    }

    /// A handle that wakes this context from any thread.
    pub fn notify_handle(&self) -> NotifyHandle {
        NotifyHandle {
            shared: self.shared.clone(),
        }
    }

    // ----- fd handlers ------------------------------------------------------------------

    /// Installs `handler` for `fd` and starts watching it.
    ///
    /// Errors: [`AioError::InvalidFd`] for a negative or closed fd, [`AioError::AlreadyRegistered`]
    /// if `fd` has a handler, [`AioError::NoCallbacks`] for an empty handler,
    /// [`AioError::Monitor`] if the monitor refuses the fd (epoll refuses regular files).
    pub fn set_fd_handler(&self, fd: RawFd, handler: FdHandler<L>) -> Result<(), AioError> {
        if !fd_is_open(fd) || fd == self.shared.notifier.as_raw_fd() {
            return Err(AioError::InvalidFd { fd });
        }
        if handler.io_read.is_none() && handler.io_write.is_none() && handler.io_poll.is_none() {
            return Err(AioError::NoCallbacks { fd });
        }
        let mut table = self.handlers.borrow_mut();
        if table.token_of(fd).is_some() {
            return Err(AioError::AlreadyRegistered { fd });
        }
        let token = table.next_token();
        let mut monitor = self.monitor.borrow_mut();
        monitor
            .register(fd, token, handler.interest())
            .map_err(|source| AioError::Monitor {
                monitor: monitor.name(),
                op: "register",
                fd,
                source,
            })?;
        let inserted = table.insert(fd, Rc::new(handler), self.now_ns(), self.poll_idle_ns.get());
        debug_assert_eq!(inserted, token);
        Ok(())
    }

    /// Replaces the callbacks of `fd`'s handler (the interest follows the new callbacks).
    /// Works from inside any callback, the handler's own included: the running callback
    /// finishes, the new ones are used from then on.
    pub fn update_fd_handler(&self, fd: RawFd, handler: FdHandler<L>) -> Result<(), AioError> {
        if handler.io_read.is_none() && handler.io_write.is_none() && handler.io_poll.is_none() {
            return Err(AioError::NoCallbacks { fd });
        }
        let mut table = self.handlers.borrow_mut();
        let token = table.token_of(fd).ok_or(AioError::NotRegistered { fd })?;
        let closed = table.get(token).is_some_and(|s| s.closed);
        if !closed {
            let mut monitor = self.monitor.borrow_mut();
            monitor
                .modify(fd, token, handler.interest())
                .map_err(|source| AioError::Monitor {
                    monitor: monitor.name(),
                    op: "modify",
                    fd,
                    source,
                })?;
        }
        let old = table.replace(
            token,
            Rc::new(handler),
            self.now_ns(),
            self.poll_idle_ns.get(),
        );
        drop(table);
        // The old callbacks may own values whose Drop calls back into the context.
        drop(old);
        Ok(())
    }

    /// Removes `fd`'s handler: none of its callbacks runs again, even if an event for it is
    /// already pending in this iteration. The fd itself is not closed.
    pub fn remove_fd_handler(&self, fd: RawFd) -> Result<(), AioError> {
        let mut table = self.handlers.borrow_mut();
        let token = table.token_of(fd).ok_or(AioError::NotRegistered { fd })?;
        let slot = table.remove(token).ok_or(AioError::NotRegistered { fd })?;
        drop(table);
        if !slot.closed {
            let mut monitor = self.monitor.borrow_mut();
            if let Err(source) = monitor.deregister(fd) {
                // The fd may have been closed behind our back: the kernel already forgot it
                // (EBADF, ENOENT). The handler is gone either way; anything else is reported.
                let forgotten = matches!(
                    source.raw_os_error(),
                    Some(libc::EBADF) | Some(libc::ENOENT)
                ) || source.kind() == io::ErrorKind::NotFound;
                if !forgotten {
                    return Err(AioError::Monitor {
                        monitor: monitor.name(),
                        op: "deregister",
                        fd,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether `fd` has a handler in this context.
    pub fn has_fd_handler(&self, fd: RawFd) -> bool {
        self.handlers.borrow().token_of(fd).is_some()
    }

    /// How many fd handlers are installed.
    pub fn fd_handler_count(&self) -> usize {
        self.handlers.borrow().len()
    }

    // ----- bottom halves ----------------------------------------------------------------

    /// Creates a bottom half running `callback` on the loop thread, once per schedule.
    pub fn bh_new(&self, callback: impl FnMut(&AioContext<L>) + 'static) -> BottomHalf {
        self.bh_create(LoopCallback::exclusive(callback), false)
    }

    /// Creates a bottom half whose callback a nested `poll()` may re-enter: scheduled again
    /// while it runs, it runs again in the next iteration of a nested loop (QEMU's semantics),
    /// where a [`AioContext::bh_new`] one waits until it has returned.
    pub fn bh_new_reentrant(&self, callback: impl Fn(&AioContext<L>) + 'static) -> BottomHalf {
        self.bh_create(LoopCallback::reentrant(callback), false)
    }

    /// Schedules `callback` to run once in the next iteration, then frees it (QEMU's
    /// `aio_bh_schedule_oneshot`).
    pub fn bh_schedule_oneshot(&self, callback: impl FnOnce(&AioContext<L>) + 'static) {
        let mut callback = Some(callback);
        let bh = self.bh_create(
            LoopCallback::exclusive(move |ctx| {
                if let Some(f) = callback.take() {
                    f(ctx)
                }
            }),
            true,
        );
        bh.schedule();
    }

    fn bh_create(&self, callback: LoopCallback<L>, oneshot: bool) -> BottomHalf {
        let generation = self.bh_next_generation.get();
        self.bh_next_generation
            .set(generation.wrapping_add(1).max(1));
        let state = Arc::new(BhState::default());
        let slot = BhSlot {
            generation,
            state: state.clone(),
            callback: Rc::new(callback),
            oneshot,
        };
        let mut bhs = self.bhs.borrow_mut();
        let index = match self.bh_free.borrow_mut().pop() {
            Some(i) => {
                bhs[i as usize] = Some(slot);
                i
            }
            None => {
                bhs.push(Some(slot));
                (bhs.len() - 1) as u32
            }
        };
        BottomHalf {
            index,
            generation,
            state,
            shared: self.shared.clone(),
        }
    }

    /// Deletes a bottom half of this context (same as [`BottomHalf::delete`], but checks that
    /// the handle belongs here).
    pub fn bh_delete(&self, bh: &BottomHalf) -> Result<(), AioError> {
        if !Arc::ptr_eq(&bh.shared, &self.shared) || bh.state.is_deleted() {
            return Err(AioError::UnknownBottomHalf { id: bh.id() });
        }
        bh.delete();
        Ok(())
    }

    /// Whether a bottom half waits to run: a queued schedule that is still live (a cancelled
    /// one leaves a stale entry that must not cost an extra iteration; seed 001).
    fn bh_pending(&self) -> bool {
        let live = |e: &BhEntry| {
            e.ticket == DELETE_TICKET
                || matches!(self.bhs.borrow().get(e.index as usize),
                    Some(Some(s)) if s.generation == e.generation && s.state.is_pending(e.ticket))
        };
        let queued = self
            .shared
            .bh_queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(live);
        queued || self.bh_slices.borrow().iter().flatten().any(live)
    }

    /// Runs the bottom halves scheduled before this call; returns whether any ran.
    fn bh_poll(&self) -> bool {
        let queued = self.shared.take_bh_queue();
        let my_level = {
            let mut slices = self.bh_slices.borrow_mut();
            slices.push(queued.into());
            slices.len()
        };
        let mut progress = false;
        loop {
            let entry = {
                let mut slices = self.bh_slices.borrow_mut();
                let next = slices[..my_level].iter_mut().find_map(|s| s.pop_front());
                match next {
                    Some(e) => e,
                    None => break,
                }
            };
            progress |= self.bh_run_entry(entry);
        }
        self.bh_slices.borrow_mut().truncate(my_level - 1);
        progress
    }

    fn bh_run_entry(&self, entry: BhEntry) -> bool {
        let (state, callback, oneshot) = {
            let bhs = self.bhs.borrow();
            match bhs.get(entry.index as usize) {
                Some(Some(s)) if s.generation == entry.generation => {
                    (s.state.clone(), s.callback.clone(), s.oneshot)
                }
                _ => return false,
            }
        };
        if entry.ticket == DELETE_TICKET {
            if state.is_deleted() {
                self.bh_free_slot(entry.index);
            }
            return false;
        }
        if !state.is_pending(entry.ticket) {
            return false;
        }
        if callback.is_busy() {
            // Running further up the stack: keep the schedule for after it returns.
            self.bh_deferred.borrow_mut().push(entry);
            return false;
        }
        if !state.claim(entry.ticket) {
            return false;
        }
        if oneshot {
            self.bh_free_slot(entry.index);
        }
        self.count(|c| c.bh_runs += 1);
        callback.invoke(self);
        let deferred = std::mem::take(&mut *self.bh_deferred.borrow_mut());
        for e in deferred {
            self.shared.push_bh(e);
        }
        true
    }

    fn bh_free_slot(&self, index: u32) {
        let old = self.bhs.borrow_mut()[index as usize].take();
        if old.is_some() {
            self.bh_free.borrow_mut().push(index);
        }
        // Dropped here, outside the borrow: the callback's captures may call into the context.
        drop(old);
    }

    // ----- timers -----------------------------------------------------------------------

    /// Creates a disarmed timer running `callback` when its deadline passes.
    pub fn timer_new(&self, callback: impl FnMut(&AioContext<L>) + 'static) -> TimerId {
        self.timers
            .borrow_mut()
            .create(Rc::new(LoopCallback::exclusive(callback)))
    }

    /// Arms `timer` for the absolute deadline `deadline_ns` on [`AioContext::now_ns`]'s clock
    /// (re-arming replaces the previous deadline). A deadline in the past fires in the next
    /// iteration. The timer never fires before its deadline.
    pub fn timer_mod(&self, timer: TimerId, deadline_ns: u64) -> Result<(), AioError> {
        if self.timers.borrow_mut().arm(timer, deadline_ns) {
            Ok(())
        } else {
            Err(AioError::UnknownTimer { id: timer.0 })
        }
    }

    /// Arms `timer` to fire `after` from now. A delay that overflows the 64-bit nanosecond
    /// clock is [`AioError::TimeoutOverflow`].
    pub fn timer_mod_in(&self, timer: TimerId, after: Duration) -> Result<(), AioError> {
        let now = self.now_ns();
        let deadline = u64::try_from(after.as_nanos())
            .ok()
            .and_then(|ns| now.checked_add(ns))
            .ok_or(AioError::TimeoutOverflow {
                requested_ns: after.as_nanos(),
                now_ns: now,
            })?;
        self.timer_mod(timer, deadline)
    }

    /// Disarms `timer` (it can be armed again).
    pub fn timer_del(&self, timer: TimerId) -> Result<(), AioError> {
        if self.timers.borrow_mut().disarm(timer) {
            Ok(())
        } else {
            Err(AioError::UnknownTimer { id: timer.0 })
        }
    }

    /// The deadline `timer` is armed for, `None` if disarmed.
    pub fn timer_deadline(&self, timer: TimerId) -> Result<Option<u64>, AioError> {
        self.timers
            .borrow_mut()
            .deadline(timer)
            .ok_or(AioError::UnknownTimer { id: timer.0 })
    }

    /// Frees `timer`; its id becomes unknown.
    pub fn timer_free(&self, timer: TimerId) -> Result<(), AioError> {
        let freed = self.timers.borrow_mut().free(timer);
        // Dropped outside the borrow: the callback's captures may call into the context.
        match freed {
            Some(callback) => {
                drop(callback);
                Ok(())
            }
            None => Err(AioError::UnknownTimer { id: timer.0 }),
        }
    }

    /// Runs the timers that expired by the time this call started and were armed before it:
    /// a callback that re-arms its timer in the past runs again in the next iteration, not in
    /// a loop here.
    fn run_timers(&self) -> bool {
        let mut progress = false;
        let now = self.now_ns();
        let armed_before = self.timers.borrow().next_sequence();
        loop {
            let expired = self.timers.borrow_mut().pop_expired(now, armed_before);
            let Some((_, callback)) = expired else { break };
            // pop_expired skipped busy timers, so this one runs.
            self.count(|c| c.timer_runs += 1);
            progress |= callback.invoke(self);
        }
        progress
    }

    // ----- the iteration ----------------------------------------------------------------

    /// The wait timeout: 0 with a bottom half pending, else until the earliest timer, else
    /// infinite (`None`). In ns.
    fn compute_timeout(&self) -> Option<u64> {
        if self.bh_pending() {
            return Some(0);
        }
        let earliest = self.timers.borrow().earliest_runnable()?;
        Some(earliest.saturating_sub(self.now_ns()))
    }

    /// Runs one iteration: waits for events (if `blocking`, until one arrives), then runs the
    /// bottom halves scheduled so far, the ready fd handlers and the expired timers. Returns
    /// whether any callback other than the context's own notifier ran (QEMU's `aio_poll`).
    ///
    /// A monitor error other than `EINTR` (which is retried) ends the iteration without fd
    /// progress; it is counted and kept for [`AioContext::take_last_wait_error`]. Use
    /// [`AioContext::try_poll`] to get it as a value.
    pub fn poll(&self, blocking: bool) -> bool {
        match self.try_poll(blocking) {
            Ok(progress) => progress,
            Err(AioError::Wait { source, .. }) => {
                *self.last_wait_error.borrow_mut() = Some(source);
                false
            }
            Err(_) => false,
        }
    }

    /// [`AioContext::poll`] that returns a failing wait as [`AioError::Wait`]. Bottom halves
    /// and timers still run in an iteration whose wait failed.
    pub fn try_poll(&self, blocking: bool) -> Result<bool, AioError> {
        let depth = self.depth.get() + 1;
        self.depth.set(depth);
        self.count(|c| {
            c.iterations += 1;
            c.max_nesting = c.max_nesting.max(depth as u64);
        });
        let result = self.iterate(blocking);
        self.depth.set(depth - 1);
        result
    }

    fn iterate(&self, blocking: bool) -> Result<bool, AioError> {
        let mut events = self.event_buffers.borrow_mut().pop().unwrap_or_default();
        let mut poll_ready: Vec<Token> = Vec::new();
        let seq = self.dispatch_seq.get() + 1;
        self.dispatch_seq.set(seq);

        let start = self.now_ns();
        let mut timeout = if blocking {
            self.compute_timeout()
        } else {
            Some(0)
        };
        if blocking && self.params.get().max_ns > 0 {
            let dropped = self.handlers.borrow_mut().drop_idle(start);
            if dropped > 0 {
                self.count(|c| c.poll_idle_removals += dropped as u64);
            }
        }

        // Busy polling: only worth it when we would otherwise block.
        let mut window = self.window.get();
        let (poll_ns, probe) = if blocking && timeout != Some(0) {
            window.next_window(&self.params.get())
        } else {
            (window.ns(), false)
        };
        if probe {
            self.count(|c| c.poll_probes += 1);
        }
        if blocking && poll_ns > 0 && timeout != Some(0) {
            let spin_ns = timeout.map_or(poll_ns, |t| t.min(poll_ns));
            let found = self.run_poll_handlers(spin_ns, &mut poll_ready);
            if found {
                timeout = Some(0);
            }
        }

        // Wait on the monitor unless polling found work and covers every handler.
        let skip_wait = timeout == Some(0)
            && !poll_ready.is_empty()
            && self.handlers.borrow().all_covered_by_polling();
        let mut wait_result = Ok(());
        if skip_wait {
            self.count(|c| c.waits_skipped += 1);
        } else {
            let armed = timeout != Some(0);
            if armed {
                // A notification or a schedule that raced with the handshake: don't sleep.
                if self.shared.wakeup.block_begin() {
                    timeout = Some(0);
                } else {
                    timeout = self.compute_timeout();
                }
            }
            wait_result = self.wait(timeout, &mut events);
            if armed {
                self.shared.wakeup.block_end();
            }
        }
        let end = self.now_ns();

        if blocking {
            let params = self.params.get();
            let block_ns = end.saturating_sub(start);
            let change = window.update(&params, block_ns, probe);
            self.window.set(window);
            match change {
                WindowChange::Shrank => self.count(|c| c.poll_shrinks += 1),
                WindowChange::ProbeHit => self.count(|c| c.poll_probe_hits += 1),
                _ => {}
            }
        }

        // Accept the notification (QEMU's aio_notify_accept).
        if self.shared.wakeup.accept() {
            self.shared.notifier.test_and_clear();
        }

        let mut progress = self.bh_poll();
        for token in poll_ready.drain(..) {
            progress |= self.dispatch(token, false, false, true, seq, end);
        }
        for ev in events.drain(..) {
            if ev.token == CONTEXT_NOTIFIER {
                // A notify() that saw notify_me just before it dropped wrote the eventfd after
                // we accepted `notified`: clear it here, or every later wait returns at once.
                self.shared.notifier.test_and_clear();
                continue;
            }
            if ev.invalid {
                progress |= self.handle_closed(ev.token, seq);
                continue;
            }
            progress |= self.dispatch(ev.token, ev.readable, ev.writable, false, seq, end);
        }
        progress |= self.run_timers();
        self.event_buffers.borrow_mut().push(events);

        wait_result.map(|()| progress).or_else(|e| {
            if progress {
                // Work was done; report the error through the counters and the next call.
                *self.last_wait_error.borrow_mut() = Some(match e {
                    AioError::Wait { source, .. } => source,
                    other => io::Error::from(other),
                });
                Ok(true)
            } else {
                Err(e)
            }
        })
    }

    fn wait(&self, timeout_ns: Option<u64>, events: &mut Vec<Event>) -> Result<(), AioError> {
        let deadline = timeout_ns.map(|t| self.now_ns().saturating_add(t));
        let mut timeout = timeout_ns;
        let mut monitor = self.monitor.borrow_mut();
        loop {
            self.count(|c| {
                if timeout == Some(0) {
                    c.nonblocking_waits += 1
                } else {
                    c.blocking_waits += 1
                }
            });
            match monitor.wait(timeout.map(Duration::from_nanos), events) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    self.count(|c| c.wait_retries += 1);
                    timeout = deadline.map(|d| d.saturating_sub(self.now_ns()));
                    if !events.is_empty() {
                        return Ok(());
                    }
                }
                Err(source) => {
                    self.count(|c| c.wait_errors += 1);
                    return Err(AioError::Wait {
                        monitor: monitor.name(),
                        source,
                    });
                }
            }
        }
    }

    /// Busy polling: calls the poll set's `io_poll` checks until one is ready, a notification
    /// arrives, or `window_ns` passes. Ready tokens go to `ready`. Returns whether to stop
    /// waiting.
    fn run_poll_handlers(&self, window_ns: u64, ready: &mut Vec<Token>) -> bool {
        let start = self.now_ns();
        // One snapshot per window: io_poll checks run no loop code, so the table cannot change
        // while we spin, and each pass is then an indirect call per handler, nothing more.
        let handlers: Vec<(Token, Rc<FdHandler<L>>)> = {
            let table = self.handlers.borrow();
            table
                .poll_set
                .iter()
                .filter_map(|&t| table.get(t).map(|slot| (t, slot.callbacks.clone())))
                .filter(|(_, cbs)| {
                    // A handler whose callback is running further up the stack cannot be
                    // dispatched now; reporting it ready would only make a nested poll spin.
                    let ready_cb = cbs.io_poll_ready.as_ref().or(cbs.io_read.as_ref());
                    cbs.io_poll.is_some() && !ready_cb.is_some_and(|cb| cb.is_busy())
                })
                .collect()
        };
        if handlers.is_empty() {
            // Nothing to poll: spinning would only check for notifications the wait sees too.
            return self.shared.wakeup.is_notified();
        }
        let mut found = false;
        let mut now = start;
        loop {
            for (token, cbs) in &handlers {
                let Some(io_poll) = &cbs.io_poll else {
                    continue;
                };
                let Ok(mut f) = io_poll.try_borrow_mut() else {
                    continue;
                };
                if f() {
                    ready.push(*token);
                    found = true;
                }
            }
            if found || self.shared.wakeup.is_notified() {
                break;
            }
            now = self.now_ns();
            if now.saturating_sub(start) >= window_ns {
                break;
            }
            std::hint::spin_loop();
        }
        let hit = found || self.shared.wakeup.is_notified();
        let spent = now.max(self.now_ns()).saturating_sub(start);
        self.count(|c| {
            c.poll_attempts += 1;
            c.busy_poll_ns += spent;
            if hit {
                c.poll_hits += 1;
            }
        });
        hit
    }

    /// Runs a handler's callbacks for one readiness report.
    fn dispatch(
        &self,
        token: Token,
        readable: bool,
        writable: bool,
        poll_ready: bool,
        seq: u64,
        now: u64,
    ) -> bool {
        // Each direction is deduplicated on its own: a report older than the last dispatch
        // of that direction (`>= seq`: already run for this wait, or by a nested poll whose later
        // wait superseded this report) is dropped. Level-triggered fds lose nothing by that.
        let (run_read, run_write, callbacks) = {
            let mut table = self.handlers.borrow_mut();
            let Some(slot) = table.get_mut(token) else {
                return false;
            };
            if slot.closed {
                return false;
            }
            let run_read = (readable || poll_ready) && slot.last_read_dispatch < seq;
            let run_write = writable && slot.last_write_dispatch < seq;
            if run_read {
                slot.last_read_dispatch = seq;
            }
            if run_write {
                slot.last_write_dispatch = seq;
            }
            let callbacks = slot.callbacks.clone();
            if run_read {
                table.mark_active(token, now, self.poll_idle_ns.get());
            }
            (run_read, run_write, callbacks)
        };
        let mut progress = false;
        if run_read {
            // Found by polling: io_poll_ready; reported by the monitor: io_read. Each falls
            // back to the other when the handler has only one of them.
            let (first, second) = if poll_ready {
                (&callbacks.io_poll_ready, &callbacks.io_read)
            } else {
                (&callbacks.io_read, &callbacks.io_poll_ready)
            };
            progress |= self.call(first.as_ref().or(second.as_ref()));
        }
        if run_write && callbacks.io_write.is_some() {
            // The read callback may have removed or replaced the handler.
            let current = self
                .handlers
                .borrow()
                .get(token)
                .map(|s| s.callbacks.clone());
            if let Some(current) = current {
                progress |= self.call(current.io_write.as_ref());
            }
        }
        progress
    }

    fn call(&self, callback: Option<&LoopCallback<L>>) -> bool {
        let Some(cb) = callback else { return false };
        let ran = cb.invoke(self);
        if ran {
            self.count(|c| c.handler_calls += 1);
        }
        ran
    }

    /// An fd closed while registered: stop watching it (no busy loop) and let its handler see
    /// the condition once through `io_read` (its read fails with `EBADF`).
    fn handle_closed(&self, token: Token, seq: u64) -> bool {
        let fd = self.handlers.borrow_mut().mark_closed(token);
        let Some(fd) = fd else { return false };
        self.count(|c| c.closed_fds += 1);
        let _ = self.monitor.borrow_mut().deregister(fd);
        let callbacks = {
            let mut table = self.handlers.borrow_mut();
            let Some(slot) = table.get_mut(token) else {
                return false;
            };
            slot.last_read_dispatch = seq;
            slot.last_write_dispatch = seq;
            slot.callbacks.clone()
        };
        self.call(
            callbacks
                .io_read
                .as_ref()
                .or(callbacks.io_poll_ready.as_ref()),
        )
    }
}

impl<L: EventLoop> Drop for AioContext<L> {
    fn drop(&mut self) {
        // Mark every bottom half deleted so handles held by other threads stop scheduling.
        for slot in self.bhs.get_mut().iter().flatten() {
            slot.state.mark_deleted();
        }
    }
}

#[cfg(test)]
mod tests;
