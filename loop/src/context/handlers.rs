//! Fd handlers: the callbacks a context runs for an fd, and the table that maps monitor tokens
//! back to them.
//!
//! This module owns the handler table's bookkeeping (tokens with generations, the fd index, the
//! last dispatch of each direction). It never calls the monitor or a callback itself; the
//! context does both, after releasing every borrow of the table, so callbacks may change the
//! table. Which handlers busy polling checks is `busy_poll`'s, told here when one comes or
//! goes.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::rc::Rc;

use aio_core::kit::fd_is_open;
use aio_core::AioError;

use crate::AioContext;
use aio_core::kit::{SlotId, Slots};
use aio_core::{EventLoop, Interest, Token};

/// A boxed callback that runs on the loop thread with access to the context.
pub(crate) type BoxedLoopFn<L> = Box<dyn FnMut(&AioContext<L>)>;
/// A boxed callback that may be re-entered by a nested poll.
pub(crate) type ReentrantLoopFn<L> = Box<dyn Fn(&AioContext<L>)>;

/// A callback the loop runs, in one of two re-entrancy modes.
pub(crate) enum LoopCallback<L: EventLoop> {
    /// `FnMut`: never re-entered; a nested poll skips it while it runs further up the stack.
    Exclusive(RefCell<BoxedLoopFn<L>>),
    /// `Fn`: may be re-entered by a nested poll (it keeps its own state in cells).
    Reentrant(ReentrantLoopFn<L>),
}

impl<L: EventLoop> LoopCallback<L> {
    pub(crate) fn exclusive(f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        LoopCallback::Exclusive(RefCell::new(Box::new(f)))
    }

    pub(crate) fn reentrant(f: impl Fn(&AioContext<L>) + 'static) -> Self {
        LoopCallback::Reentrant(Box::new(f))
    }

    /// Runs the callback unless it is exclusive and already running; returns whether it ran.
    pub(crate) fn invoke(&self, ctx: &AioContext<L>) -> bool {
        match self {
            LoopCallback::Exclusive(cell) => match cell.try_borrow_mut() {
                Ok(mut f) => {
                    f(ctx);
                    true
                }
                Err(_) => false,
            },
            LoopCallback::Reentrant(f) => {
                f(ctx);
                true
            }
        }
    }

    /// Whether `invoke` would refuse to run it now.
    pub(crate) fn is_busy(&self) -> bool {
        match self {
            LoopCallback::Exclusive(cell) => cell.try_borrow_mut().is_err(),
            LoopCallback::Reentrant(_) => false,
        }
    }
}
/// A cheap, syscall-free readiness check.
pub(crate) type PollCheck = RefCell<Box<dyn FnMut() -> bool>>;
/// A hook run when busy polling of a handler begins or ends.
pub(crate) type PollHook = RefCell<Box<dyn FnMut()>>;

/// The callbacks of one fd, built with the `on_*` methods and installed with
/// [`AioContext::set_fd_handler`].
///
/// * `io_read` runs when the fd is readable (or hung up, or in error, or was closed);
/// * `io_write` runs when the fd is writable;
/// * `io_poll` is a cheap check, without syscalls, that busy polling calls instead of waiting
///   (e.g. "is there a new request in my queue?"); it must not touch the context;
/// * `io_poll_ready` runs when `io_poll` returned true;
/// * `io_poll_begin` and `io_poll_end` bracket the time the loop busy-polls the handler
///   (QEMU's polling mode, in which virtio turns the guest's notifications off): the loop
///   checks `io_poll` once more after `io_poll_end`, so that work queued while notifications
///   were off is found. The rules are on [`FdHandler::on_poll_begin`].
///
/// Callbacks must tolerate being called when nothing is left to do (fds are level-triggered and
/// a nested `poll()` may already have drained them): use non-blocking fds.
pub struct FdHandler<L: EventLoop> {
    pub(crate) io_read: Option<LoopCallback<L>>,
    pub(crate) io_write: Option<LoopCallback<L>>,
    pub(crate) io_poll: Option<PollCheck>,
    pub(crate) io_poll_ready: Option<LoopCallback<L>>,
    pub(crate) io_poll_begin: Option<PollHook>,
    pub(crate) io_poll_end: Option<PollHook>,
    /// `io_poll_begin` ran and `io_poll_end` has not yet.
    pub(crate) poll_begun: Cell<bool>,
}

impl<L: EventLoop> Default for FdHandler<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<L: EventLoop> fmt::Debug for FdHandler<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FdHandler")
            .field("io_read", &self.io_read.is_some())
            .field("io_write", &self.io_write.is_some())
            .field("io_poll", &self.io_poll.is_some())
            .field("io_poll_ready", &self.io_poll_ready.is_some())
            .field("io_poll_begin", &self.io_poll_begin.is_some())
            .field("io_poll_end", &self.io_poll_end.is_some())
            .finish()
    }
}

impl<L: EventLoop> FdHandler<L> {
    /// A handler with no callbacks yet.
    pub fn new() -> Self {
        FdHandler {
            io_read: None,
            io_write: None,
            io_poll: None,
            io_poll_ready: None,
            io_poll_begin: None,
            io_poll_end: None,
            poll_begun: Cell::new(false),
        }
    }

    /// Sets the `io_read` callback.
    pub fn on_read(mut self, f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        self.io_read = Some(LoopCallback::exclusive(f));
        self
    }

    /// Sets the `io_write` callback.
    pub fn on_write(mut self, f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        self.io_write = Some(LoopCallback::exclusive(f));
        self
    }

    /// Sets an `io_read` callback that a nested `poll()` may re-enter (for handlers whose
    /// callbacks run nested loops, such as an engine's completion delivery).
    pub fn on_read_reentrant(mut self, f: impl Fn(&AioContext<L>) + 'static) -> Self {
        self.io_read = Some(LoopCallback::reentrant(f));
        self
    }

    /// Sets an `io_poll_ready` callback that a nested `poll()` may re-enter.
    pub fn on_poll_ready_reentrant(mut self, f: impl Fn(&AioContext<L>) + 'static) -> Self {
        self.io_poll_ready = Some(LoopCallback::reentrant(f));
        self
    }

    /// Sets the `io_poll` check used by busy polling.
    pub fn on_poll(mut self, f: impl FnMut() -> bool + 'static) -> Self {
        self.io_poll = Some(RefCell::new(Box::new(f)));
        self
    }

    /// Sets the `io_poll_ready` callback, run when `io_poll` returned true.
    pub fn on_poll_ready(mut self, f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        self.io_poll_ready = Some(LoopCallback::exclusive(f));
        self
    }

    /// Sets `io_poll_begin`, run when the loop starts busy-polling this handler (QEMU's
    /// `io_poll_begin`; virtio-blk turns the guest's queue notifications off there, since the
    /// loop is looking at the queue anyway). Polling mode (QEMU's `poll_set_started()`):
    ///
    /// * Only handlers with an `io_poll` check take part. An iteration that busy-polls begins
    ///   polling mode for every handler in the poll set that is not in it yet.
    /// * An iteration that does not find work by polling (it is about to block, or it did not
    ///   poll at all) ends polling mode: `io_poll_end` runs for every handler in it, then
    ///   `io_poll` once more, and if that finds work, `io_poll_ready` runs in this iteration
    ///   and it does not block. Work queued between the last check and `io_poll_end` (while
    ///   the guest was told not to notify) is found that way.
    /// * A handler that leaves the poll set (idle, or its fd closed) is ended the same way by
    ///   the next iteration. One removed or replaced while in polling mode gets `io_poll_end`
    ///   at once (without the last check: its callbacks are gone).
    /// * The hooks must not touch the context; one already running is not run again.
    pub fn on_poll_begin(mut self, f: impl FnMut() + 'static) -> Self {
        self.io_poll_begin = Some(RefCell::new(Box::new(f)));
        self
    }

    /// Sets `io_poll_end`, run when the loop stops busy-polling this handler (QEMU's
    /// `io_poll_end`; virtio-blk turns the guest's notifications back on). See
    /// [`FdHandler::on_poll_begin`] for when.
    pub fn on_poll_end(mut self, f: impl FnMut() + 'static) -> Self {
        self.io_poll_end = Some(RefCell::new(Box::new(f)));
        self
    }

    /// Whether polling mode concerns this handler (an `io_poll` check and a hook).
    pub(crate) fn has_poll_hooks(&self) -> bool {
        self.io_poll.is_some() && (self.io_poll_begin.is_some() || self.io_poll_end.is_some())
    }

    /// What the monitor must watch the fd for.
    pub(crate) fn interest(&self) -> Interest {
        // A handler that only polls still needs its fd watched, so that it is woken when it
        // has left the poll set (idle) or polling is off; its readiness then runs
        // io_poll_ready.
        let mut interest = Interest::NONE;
        if self.io_read.is_some() || self.io_poll.is_some() {
            interest |= Interest::READABLE;
        }
        if self.io_write.is_some() {
            interest |= Interest::WRITABLE;
        }
        interest
    }
}

/// One installed handler.
pub(crate) struct HandlerSlot<L: EventLoop> {
    pub(crate) fd: RawFd,
    pub(crate) callbacks: Rc<FdHandler<L>>,
    /// The fd was reported closed (`POLLNVAL`); it is no longer watched.
    pub(crate) closed: bool,
    /// The last wait whose report ran the read side (`io_read` / `io_poll_ready`).
    pub(crate) last_read_dispatch: u64,
    /// The last wait whose report ran `io_write`.
    pub(crate) last_write_dispatch: u64,
}

/// Slots addressed by token: the low 32 bits index, the high 32 bits a generation, so that an
/// event or poll-set entry of a removed handler can never reach a new handler in the same slot.
pub(crate) struct HandlerTable<L: EventLoop> {
    slots: Slots<HandlerSlot<L>>,
    by_fd: HashMap<RawFd, Token>,
    /// Handlers with an `io_write` callback.
    writers: usize,
    /// Handlers with polling-mode hooks ([`FdHandler::has_poll_hooks`]).
    hooked: usize,
}

impl<L: EventLoop> HandlerTable<L> {
    pub(crate) fn new() -> Self {
        HandlerTable {
            slots: Slots::new(),
            by_fd: HashMap::new(),
            writers: 0,
            hooked: 0,
        }
    }

    pub(crate) fn token_of(&self, fd: RawFd) -> Option<Token> {
        self.by_fd.get(&fd).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_fd.len()
    }

    /// Whether some handler waits for writability (which only the monitor reports).
    pub(crate) fn has_writers(&self) -> bool {
        self.writers > 0
    }

    pub(crate) fn get(&self, token: Token) -> Option<&HandlerSlot<L>> {
        self.slots.get(SlotId::from_u64(token.0))
    }

    pub(crate) fn get_mut(&mut self, token: Token) -> Option<&mut HandlerSlot<L>> {
        self.slots.get_mut(SlotId::from_u64(token.0))
    }

    /// The token the next [`HandlerTable::insert`] gives (the monitor learns it first).
    pub(crate) fn next_token(&self) -> Token {
        Token(self.slots.next_id().to_u64())
    }

    pub(crate) fn insert(&mut self, fd: RawFd, callbacks: Rc<FdHandler<L>>) -> Token {
        self.writers += usize::from(callbacks.io_write.is_some());
        self.hooked += usize::from(callbacks.has_poll_hooks());
        let token = Token(
            self.slots
                .insert(HandlerSlot {
                    fd,
                    callbacks,
                    closed: false,
                    last_read_dispatch: 0,
                    last_write_dispatch: 0,
                })
                .to_u64(),
        );
        self.by_fd.insert(fd, token);
        token
    }

    /// Replaces the callbacks of a live handler, keeping its token; returns the old ones so
    /// that the caller drops them after releasing the table.
    pub(crate) fn replace(
        &mut self,
        token: Token,
        callbacks: Rc<FdHandler<L>>,
    ) -> Option<Rc<FdHandler<L>>> {
        let slot = self.get_mut(token)?;
        let was_writer = slot.callbacks.io_write.is_some();
        let is_writer = callbacks.io_write.is_some();
        let (was_hooked, is_hooked) = (slot.callbacks.has_poll_hooks(), callbacks.has_poll_hooks());
        let old = std::mem::replace(&mut slot.callbacks, callbacks);
        self.writers = self.writers + usize::from(is_writer) - usize::from(was_writer);
        self.hooked = self.hooked + usize::from(is_hooked) - usize::from(was_hooked);
        Some(old)
    }

    pub(crate) fn remove(&mut self, token: Token) -> Option<HandlerSlot<L>> {
        let slot = self.slots.remove(SlotId::from_u64(token.0))?;
        self.writers -= usize::from(slot.callbacks.io_write.is_some());
        self.hooked -= usize::from(slot.callbacks.has_poll_hooks());
        self.by_fd.remove(&slot.fd);
        Some(slot)
    }

    /// How many handlers have polling-mode hooks.
    pub(crate) fn hooked_count(&self) -> usize {
        self.hooked
    }

    /// Whether the handler is live, not closed, and has an `io_poll` check (busy polling may
    /// check it).
    pub(crate) fn is_pollable(&self, token: Token) -> bool {
        self.get(token)
            .is_some_and(|slot| !slot.closed && slot.callbacks.io_poll.is_some())
    }

    /// Marks a handler's fd as closed: it is no longer watched (the caller takes it out of the
    /// poll set).
    pub(crate) fn mark_closed(&mut self, token: Token) -> Option<RawFd> {
        let slot = self.get_mut(token)?;
        if slot.closed {
            return None;
        }
        slot.closed = true;
        Some(slot.fd)
    }
}

impl<L: EventLoop> AioContext<L> {
    /// Installs `handler` for `fd` and starts watching it.
    ///
    /// The handler outlives the borrow: remove it ([`AioContext::remove_fd_handler`]) before
    /// the fd is closed. An fd closed while its handler is installed is no memory hazard, only
    /// a lost registration: where the monitor says so (ppoll's `POLLNVAL`) the handler's
    /// `io_read` runs once and the fd is no longer watched (`LoopCounters::closed_fds`).
    ///
    /// Errors: [`AioError::InvalidFd`] for the context's own notifier,
    /// [`AioError::AlreadyRegistered`] if `fd` has a handler, [`AioError::NoCallbacks`] for an
    /// empty handler, [`AioError::Monitor`] if the monitor refuses the fd (epoll refuses
    /// regular files).
    pub fn set_fd_handler(&self, fd: impl AsFd, handler: FdHandler<L>) -> Result<(), AioError> {
        let borrowed = fd.as_fd();
        let fd = borrowed.as_raw_fd();
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
        self.monitor_call("register", fd, |m| {
            m.register(borrowed, token, handler.interest())
        })?;
        let polled = handler.io_poll.is_some();
        let inserted = table.insert(fd, Rc::new(handler));
        debug_assert_eq!(inserted, token);
        if polled {
            self.busy_poll.join(token, self.now_ns());
        }
        Ok(())
    }

    /// Replaces the callbacks of `fd`'s handler (the interest follows the new callbacks).
    /// Works from inside any callback, the handler's own included: the running callback
    /// finishes, the new ones are used from then on.
    pub fn update_fd_handler(&self, fd: impl AsFd, handler: FdHandler<L>) -> Result<(), AioError> {
        let borrowed = fd.as_fd();
        let fd = borrowed.as_raw_fd();
        if handler.io_read.is_none() && handler.io_write.is_none() && handler.io_poll.is_none() {
            return Err(AioError::NoCallbacks { fd });
        }
        let mut table = self.handlers.borrow_mut();
        let token = table.token_of(fd).ok_or(AioError::NotRegistered { fd })?;
        let closed = table.get(token).is_some_and(|s| s.closed);
        if !closed {
            self.monitor_call("modify", fd, |m| {
                m.modify(borrowed, token, handler.interest())
            })?;
        }
        let old = table.replace(token, Rc::new(handler));
        let pollable = table.is_pollable(token);
        drop(table);
        if pollable {
            self.busy_poll.join(token, self.now_ns());
        } else {
            self.busy_poll.leave(token);
        }
        if let Some(old) = &old {
            old.end_polling(false);
        }
        // The old callbacks may own values whose Drop calls back into the context.
        drop(old);
        Ok(())
    }

    /// Removes `fd`'s handler: none of its callbacks runs again, even if an event for it is
    /// already pending in this iteration. The fd itself is not closed.
    pub fn remove_fd_handler(&self, fd: impl AsFd) -> Result<(), AioError> {
        let borrowed = fd.as_fd();
        let fd = borrowed.as_raw_fd();
        let mut table = self.handlers.borrow_mut();
        let token = table.token_of(fd).ok_or(AioError::NotRegistered { fd })?;
        let slot = table.remove(token).ok_or(AioError::NotRegistered { fd })?;
        drop(table);
        self.busy_poll.leave(token);
        slot.callbacks.end_polling(false);
        if !slot.closed {
            let mut monitor = self.monitor.borrow_mut();
            if let Err(source) = monitor.deregister(borrowed) {
                // The kernel may have forgotten the fd already (EBADF, ENOENT: it was closed
                // and reopened meanwhile). The handler is gone either way; anything else is
                // reported.
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

    /// Removes the handler of fd number `fd` after that fd was closed while the handler was
    /// installed (against [`AioContext::set_fd_handler`]'s rule; the number can no longer be
    /// lent as a live fd). None of its callbacks runs again; the monitor forgets the number
    /// without acting on it, since it may already name another file.
    /// [`AioError::NotRegistered`] if no handler is installed under that number.
    ///
    /// This repairs the context's tables, not the kernel's: epoll keeps its entry for a file
    /// that is still open through another descriptor (a `dup`, a fork), and a ready file there
    /// keeps waking the wait with a token nothing answers to. Remove handlers before closing.
    pub fn forget_closed_fd(&self, fd: RawFd) -> Result<(), AioError> {
        let mut table = self.handlers.borrow_mut();
        let token = table.token_of(fd).ok_or(AioError::NotRegistered { fd })?;
        let slot = table.remove(token).ok_or(AioError::NotRegistered { fd })?;
        drop(table);
        self.busy_poll.leave(token);
        slot.callbacks.end_polling(false);
        if !slot.closed {
            // Not reported closed yet (epoll and io_uring forget closed fds silently).
            let _ = self.monitor.borrow_mut().forget_closed(fd);
        }
        Ok(())
    }

    /// Runs one monitor call; its failure becomes [`AioError::Monitor`] naming the call.
    fn monitor_call(
        &self,
        op: &'static str,
        fd: RawFd,
        call: impl FnOnce(&mut L) -> io::Result<()>,
    ) -> Result<(), AioError> {
        let mut monitor = self.monitor.borrow_mut();
        call(&mut monitor).map_err(|source| AioError::Monitor {
            monitor: monitor.name(),
            op,
            fd,
            source,
        })
    }

    /// Whether `fd` has a handler in this context.
    pub fn has_fd_handler(&self, fd: impl AsFd) -> bool {
        self.handlers
            .borrow()
            .token_of(fd.as_fd().as_raw_fd())
            .is_some()
    }

    /// How many fd handlers are installed.
    pub fn fd_handler_count(&self) -> usize {
        self.handlers.borrow().len()
    }
}
