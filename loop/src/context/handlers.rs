//! Fd handlers: [`FdHandler`], the callbacks a user gives for an fd, and the context's calls
//! that install, replace and remove them (QEMU's `aio_set_fd_handler`).
//!
//! This module owns those calls and the monitor calls they make (register, modify,
//! deregister); the table that maps monitor tokens back to the callbacks, and its bookkeeping,
//! are `handler_table.rs`'s. It runs no callback: replaced or removed ones are dropped after
//! the table is released, since what they own may call back into the context. Which handlers
//! busy polling checks is `busy_poll`'s, told here when one comes or goes.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::rc::Rc;

use aio_core::kit::fd_is_open;
use aio_core::AioError;

use super::callback::LoopCallback;
use super::handler_table::HandlerCallbacks;
use crate::AioContext;
use aio_core::EventLoop;

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
    /// What the table keeps once the handler is installed.
    pub(crate) callbacks: HandlerCallbacks<AioContext<L>>,
}

impl<L: EventLoop> Default for FdHandler<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<L: EventLoop> fmt::Debug for FdHandler<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FdHandler")
            .field("io_read", &self.callbacks.io_read.is_some())
            .field("io_write", &self.callbacks.io_write.is_some())
            .field("io_poll", &self.callbacks.io_poll.is_some())
            .field("io_poll_ready", &self.callbacks.io_poll_ready.is_some())
            .field("io_poll_begin", &self.callbacks.io_poll_begin.is_some())
            .field("io_poll_end", &self.callbacks.io_poll_end.is_some())
            .finish()
    }
}

impl<L: EventLoop> FdHandler<L> {
    /// A handler with no callbacks yet.
    pub fn new() -> Self {
        FdHandler {
            callbacks: HandlerCallbacks::new(),
        }
    }

    /// Sets the `io_read` callback.
    pub fn on_read(mut self, f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        self.callbacks.io_read = Some(LoopCallback::exclusive(f));
        self
    }

    /// Sets the `io_write` callback.
    pub fn on_write(mut self, f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        self.callbacks.io_write = Some(LoopCallback::exclusive(f));
        self
    }

    /// Sets an `io_read` callback that a nested `poll()` may re-enter (for handlers whose
    /// callbacks run nested loops, such as an engine's completion delivery).
    pub fn on_read_reentrant(mut self, f: impl Fn(&AioContext<L>) + 'static) -> Self {
        self.callbacks.io_read = Some(LoopCallback::reentrant(f));
        self
    }

    /// Sets an `io_poll_ready` callback that a nested `poll()` may re-enter.
    pub fn on_poll_ready_reentrant(mut self, f: impl Fn(&AioContext<L>) + 'static) -> Self {
        self.callbacks.io_poll_ready = Some(LoopCallback::reentrant(f));
        self
    }

    /// Sets the `io_poll` check used by busy polling.
    pub fn on_poll(mut self, f: impl FnMut() -> bool + 'static) -> Self {
        self.callbacks.io_poll = Some(RefCell::new(Box::new(f)));
        self
    }

    /// Sets the `io_poll_ready` callback, run when `io_poll` returned true.
    pub fn on_poll_ready(mut self, f: impl FnMut(&AioContext<L>) + 'static) -> Self {
        self.callbacks.io_poll_ready = Some(LoopCallback::exclusive(f));
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
        self.callbacks.io_poll_begin = Some(RefCell::new(Box::new(f)));
        self
    }

    /// Sets `io_poll_end`, run when the loop stops busy-polling this handler (QEMU's
    /// `io_poll_end`; virtio-blk turns the guest's notifications back on). See
    /// [`FdHandler::on_poll_begin`] for when.
    pub fn on_poll_end(mut self, f: impl FnMut() + 'static) -> Self {
        self.callbacks.io_poll_end = Some(RefCell::new(Box::new(f)));
        self
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
        if handler.callbacks.io_read.is_none()
            && handler.callbacks.io_write.is_none()
            && handler.callbacks.io_poll.is_none()
        {
            return Err(AioError::NoCallbacks { fd });
        }
        let mut table = self.handlers.borrow_mut();
        if table.token_of(fd).is_some() {
            return Err(AioError::AlreadyRegistered { fd });
        }
        let token = table.next_token();
        self.monitor_call("register", fd, |m| {
            m.register(borrowed, token, handler.callbacks.interest())
        })?;
        let polled = handler.callbacks.io_poll.is_some();
        let inserted = table.insert(fd, Rc::new(handler.callbacks));
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
        if handler.callbacks.io_read.is_none()
            && handler.callbacks.io_write.is_none()
            && handler.callbacks.io_poll.is_none()
        {
            return Err(AioError::NoCallbacks { fd });
        }
        let mut table = self.handlers.borrow_mut();
        let token = table.token_of(fd).ok_or(AioError::NotRegistered { fd })?;
        let closed = table.get(token).is_some_and(|s| s.closed);
        if !closed {
            self.monitor_call("modify", fd, |m| {
                m.modify(borrowed, token, handler.callbacks.interest())
            })?;
        }
        let old = table.replace(token, Rc::new(handler.callbacks));
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
