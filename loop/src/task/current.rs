//! The context a future is polled in: what timers and readiness futures reach, without a
//! reference to the context in every future.
//!
//! This module owns the thread-local "current context" and the small, type-erased view of a
//! context ([`LoopServices`]) that the loop's futures need. [`AioContext::block_on`] and the
//! executor's bottom half set it for the duration of a poll (a nested `block_on` pushes and
//! pops, so the innermost context wins), so the view is never used after its context.
//!
//! [`AioContext::block_on`]: crate::AioContext::block_on

use std::cell::Cell;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};

use crate::context::handlers::FdHandler;
use crate::context::timer_table::TimerId;
use crate::AioContext;
use aio_core::EventLoop;

/// What the loop's futures ask of the context they are polled in.
pub(crate) trait LoopServices {
    /// The context's clock.
    fn now_ns(&self) -> u64;
    /// A one-shot timer that runs `fire` at `deadline_ns`.
    fn call_at(&self, deadline_ns: u64, fire: Box<dyn FnOnce()>) -> TimerId;
    /// Frees a timer that has not fired.
    fn cancel_timer(&self, timer: TimerId);
    /// Watches `fd`: `fire` runs once when it is readable (or writable), and the handler is
    /// removed then.
    fn watch(&self, fd: BorrowedFd<'_>, writable: bool, fire: Box<dyn FnOnce()>) -> io::Result<()>;
    /// Stops watching `fd` (a no-op if the watch already fired).
    fn unwatch(&self, fd: RawFd);
}

impl<L: EventLoop + 'static> LoopServices for AioContext<L> {
    fn now_ns(&self) -> u64 {
        AioContext::now_ns(self)
    }

    fn call_at(&self, deadline_ns: u64, fire: Box<dyn FnOnce()>) -> TimerId {
        let mut fire = Some(fire);
        let timer = self.timer_new(move |_| {
            if let Some(f) = fire.take() {
                f();
            }
        });
        // A fresh timer id cannot be stale, and a past deadline fires in the next iteration.
        let _ = self.timer_mod(timer, deadline_ns);
        timer
    }

    fn cancel_timer(&self, timer: TimerId) {
        let _ = self.timer_free(timer);
    }

    fn watch(&self, fd: BorrowedFd<'_>, writable: bool, fire: Box<dyn FnOnce()>) -> io::Result<()> {
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let mut fire = Some(fire);
        let fire = move |ctx: &AioContext<L>| {
            // One-shot: the future watches again if it needs another event.
            let _ = ctx.forget_watch(raw);
            if let Some(f) = fire.take() {
                f();
            }
        };
        let handler = if writable {
            FdHandler::new().on_write(fire)
        } else {
            FdHandler::new().on_read(fire)
        };
        self.set_fd_handler(fd, handler).map_err(io::Error::from)
    }

    fn unwatch(&self, fd: RawFd) {
        let _ = self.forget_watch(fd);
    }
}

impl<L: EventLoop + 'static> AioContext<L> {
    /// Removes the handler of a readiness future's fd, by number (the future holds the fd's
    /// borrow, so it is still open).
    fn forget_watch(&self, fd: RawFd) -> Result<(), aio_core::AioError> {
        // SAFETY: the readiness future that registered `fd` borrows it for as long as it is
        // registered (it unregisters on completion and on drop), so the fd is open here.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        self.remove_fd_handler(fd)
    }
}

thread_local! {
    /// The innermost context polling a future on this thread.
    static CURRENT: Cell<Option<*const dyn LoopServices>> = const { Cell::new(None) };
}

/// Sets `ctx` as the current context for the duration of `f`.
pub(crate) fn enter<L: EventLoop + 'static, R>(ctx: &AioContext<L>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<*const dyn LoopServices>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let services: &dyn LoopServices = ctx;
    let previous = CURRENT.with(|c| c.replace(Some(services as *const dyn LoopServices)));
    // Restored on the way out, a panic included.
    let _restore = Restore(previous);
    f()
}

/// Runs `f` with the current context, or returns the error a future reports when it is
/// polled outside one.
pub(crate) fn with_current<R>(f: impl FnOnce(&dyn LoopServices) -> R) -> io::Result<R> {
    let current = CURRENT.with(|c| c.get());
    match current {
        // SAFETY: `enter` set the pointer from a live `&AioContext` and clears it (restoring
        // the outer one) before that borrow ends, so it is valid for the whole of this call,
        // which runs inside `enter`'s closure on the same thread.
        Some(ptr) => Ok(f(unsafe { &*ptr })),
        None => Err(io::Error::other(
            "an aio-rs future was polled outside its context (use AioContext::block_on or \
             AioContext::spawn)",
        )),
    }
}
