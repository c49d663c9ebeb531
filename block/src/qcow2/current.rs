//! Which engine an image's I/O runs on: the one of the queue whose request is being served.
//!
//! This module owns the per-request I/O context ([`RequestIo`]), the thread-local slot that
//! holds it while the request's future is polled ([`WithIo`]), and the small executor that
//! runs an image's futures where no queue serves a request (opening, the final flush). It
//! never touches the image's format.
//!
//! * imago's storage object is shared by every iothread serving the image (`Send + Sync`),
//!   while an engine belongs to one iothread's context (`!Send`). So the storage does not hold
//!   an engine: each request's future runs inside a [`WithIo`], which makes that request's
//!   engine, memory hold and data ranges the current ones for the duration of every poll.
//!   imago spawns no tasks, so every storage call a request makes happens inside its polls.
//! * Outside a request (no current [`RequestIo`]) the storage does blocking syscalls on the
//!   calling thread: opening an image and flushing it at shutdown are not on a queue's path.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use aio_core::engine::{IoEngine, LentMemory, MemoryHold, Request};
use aio_core::EventLoop;
use aio_loop::task::RequestFuture;
use aio_loop::AttachedEngine;
use smallvec::SmallVec;

use super::settle::WriteInFlight;

/// An engine attached to the current thread's context, with its type erased (the storage is
/// shared by iothreads whose engines may differ in type).
pub(crate) trait ImageEngine {
    /// Submits `request`; `keep` is held until the engine is done with the request's memory,
    /// even if the returned future is dropped first.
    fn run(&self, request: Request, keep: Keep) -> RequestFuture;
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> ImageEngine for AttachedEngine<L, E> {
    fn run(&self, request: Request, keep: Keep) -> RequestFuture {
        self.run_keeping(request, keep)
    }
}

/// What a request in flight holds until the engine is done with its memory: held, never
/// read (dropping it is the point). The hold of the caller's memory needs no place here: it
/// travels inside the request's [`LentMemory`].
#[derive(Default)]
#[allow(dead_code)]
pub(crate) struct Keep {
    /// Counts it among the image's modifying requests in flight (imago's `settle_writes`).
    pub(crate) write: Option<WriteInFlight>,
}

/// The address ranges of a request's data segments: inline up to four (a request usually has
/// one).
pub(crate) type DataRanges = SmallVec<[(usize, usize); 4]>;

/// One request's I/O context: its queue's engine, and the caller's memory its data lives in.
pub(crate) struct RequestIo {
    pub(crate) engine: Rc<dyn ImageEngine>,
    /// What keeps the request's memory valid (its [`LentMemory`]'s hold); None: the memory
    /// was lent without one, or there is none (metadata work), and every storage I/O goes
    /// through an engine-owned copy.
    pub(crate) memory: Option<MemoryHold>,
    /// The address ranges `[start, end)` of the request's data segments: a buffer imago hands
    /// the storage inside one of them is the caller's memory (direct I/O, lent on with a clone
    /// of `memory`); any other buffer is imago's own and goes through an engine-owned copy.
    pub(crate) data: DataRanges,
}

impl RequestIo {
    /// Whether `[base, base + len)` lies inside one of the request's data segments.
    fn in_data(&self, base: usize, len: usize) -> bool {
        let end = base.saturating_add(len);
        self.data.iter().any(|&(s, e)| s <= base && end <= e)
    }

    /// `iov` as a part of the caller's memory, lent on to the engine with a clone of its
    /// hold, when every segment lies inside the request's data (None: a buffer of imago's own,
    /// or memory lent without a hold, to go through an engine-owned copy).
    pub(crate) fn caller_memory(&self, iov: &[libc::iovec]) -> Option<LentMemory> {
        let hold = self.memory.as_ref()?;
        if !iov
            .iter()
            .all(|v| self.in_data(v.iov_base as usize, v.iov_len))
        {
            return None;
        }
        let parts = iov.iter().map(|v| (v.iov_base.cast::<u8>(), v.iov_len));
        // SAFETY: every segment lies in the request's data, which `LentMemory::new`'s caller
        // promised valid while any clone of its hold lives, and unused by anyone else until
        // the request ends (which it does only after this part has come back: the request's
        // future awaits it). The part carries a clone of that hold, which the engine keeps
        // until it is done with the part, so the memory stays valid even if the request's
        // future is dropped first.
        Some(unsafe { LentMemory::new(parts, Some(hold.clone())) })
    }
}

thread_local! {
    /// The request whose future is being polled on this thread, if any.
    static CURRENT: RefCell<Option<Rc<RequestIo>>> = const { RefCell::new(None) };
}

/// The request being served on this thread, if any.
pub(crate) fn current() -> Option<Rc<RequestIo>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Runs `f` with no current request: its storage I/O is blocking syscalls, not the engine of
/// the request being polled (a read through to a backing node from inside a request).
pub(crate) fn without_engine<R>(f: impl FnOnce() -> R) -> R {
    with_io(None, f)
}

/// Runs `f` with `io` as the current request (`None`: none), restoring the previous one after,
/// a panic included.
fn with_io<R>(io: Option<Rc<RequestIo>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<RequestIo>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), io));
    let _restore = Restore(previous);
    f()
}

pin_project_lite::pin_project! {
    /// A request's future, polled with its [`RequestIo`] current. The future lives inline
    /// (pinned with the task that holds it), not in a box of its own: one allocation less per
    /// request.
    pub(crate) struct WithIo<F> {
        io: Rc<RequestIo>,
        #[pin]
        inner: F,
    }
}

impl<F: Future> WithIo<F> {
    pub(crate) fn new(io: RequestIo, inner: F) -> Self {
        WithIo {
            io: Rc::new(io),
            inner,
        }
    }
}

impl<F: Future> Future for WithIo<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let io = this.io.clone();
        let inner = this.inner;
        with_io(Some(io), || inner.poll(cx))
    }
}

/// Wakes the thread parked in [`block_on`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to its end on the calling thread, with no request current (so the storage
/// does blocking syscalls), parking while it waits for a lock another thread holds.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    with_io(None, || loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    })
}
