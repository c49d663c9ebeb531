//! Readiness futures: [`readable`] and [`writable`] on any monitor.
//!
//! This module owns the one-shot watch of an fd for a future: a handler registered on first
//! poll, removed when it fires or when the future is dropped. It never reads or writes the fd.

use std::cell::Cell;
use std::future::Future;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use super::current::with_current;

/// Completes when `fd` is readable (level-triggered: at once if it already is). The fd must
/// not have a handler of its own in the polling context (that is an `AlreadyRegistered`
/// error), and is borrowed until the future ends.
pub fn readable<'fd>(fd: &'fd impl AsFd) -> Readiness<'fd> {
    Readiness::new(fd.as_fd(), false)
}

/// Completes when `fd` is writable; as [`readable`].
pub fn writable<'fd>(fd: &'fd impl AsFd) -> Readiness<'fd> {
    Readiness::new(fd.as_fd(), true)
}

/// The future of [`readable`] and [`writable`].
///
/// `!Send`: it belongs to the loop thread that polls it (its fired flag is an `Rc`).
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Readiness<'fd> {
    fd: RawFd,
    writable: bool,
    /// Registered, and whether it fired.
    watch: Option<Rc<Cell<bool>>>,
    _fd: PhantomData<BorrowedFd<'fd>>,
}

impl<'fd> Readiness<'fd> {
    fn new(fd: BorrowedFd<'fd>, writable: bool) -> Self {
        Readiness {
            fd: fd.as_raw_fd(),
            writable,
            watch: None,
            _fd: PhantomData,
        }
    }
}

impl Future for Readiness<'_> {
    type Output = std::io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(fired) = &this.watch {
            if fired.get() {
                this.watch = None;
                return Poll::Ready(Ok(()));
            }
            return Poll::Pending;
        }
        let fired = Rc::new(Cell::new(false));
        let (f, waker) = (fired.clone(), cx.waker().clone());
        // SAFETY: `_fd` borrows the fd for the future's lifetime; the watch is removed when it
        // fires and when the future is dropped, so it never outlives the borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(this.fd) };
        let watched = with_current(|ctx| {
            ctx.watch(
                fd,
                this.writable,
                Box::new(move || {
                    f.set(true);
                    waker.wake();
                }),
            )
        });
        match watched {
            Ok(Ok(())) => {
                this.watch = Some(fired);
                Poll::Pending
            }
            Ok(Err(e)) | Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl Drop for Readiness<'_> {
    fn drop(&mut self) {
        if let Some(fired) = self.watch.take() {
            if !fired.get() {
                let fd = self.fd;
                let _ = with_current(|ctx| ctx.unwatch(fd));
            }
        }
    }
}
