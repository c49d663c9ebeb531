//! Engine futures: every engine op as a future on an [`AttachedEngine`], buffers owned by the
//! engine while in flight and handed back with the result (the design of tokio-uring and
//! monoio).
//!
//! This module owns [`RequestFuture`] and its cancellation rule. It builds on the per-request
//! delivery of [`AttachedEngine::submit_with`], with the future's shared state in place of a
//! callback (one allocation per request); it never touches an engine's internals.
//!
//! Dropping an [`RequestFuture`] before it completes cancels the request ([`IoEngine::cancel`]: a
//! queued request at once, one in the kernel where the engine can) and leaves its memory with
//! the engine: the late completion, when the kernel or the worker is done, is discarded and
//! only then are the buffers freed.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use aio_core::engine::{AlignedBuf, Completion, IoBuffers, IoEngine, IoFile, LentMemory, Request};
use aio_core::EventLoop;

use crate::attached::{AttachedEngine, CancelRequest, Delivery, RequestId, RequestSlot};

/// What a request's delivery and its future share: the request's one allocation, with what
/// the request keeps alive until the engine is done with its memory.
struct OpShared<K> {
    completion: Option<Completion>,
    waker: Option<Waker>,
    /// The future was dropped: the delivery discards the completion.
    abandoned: bool,
    /// Dropped when the completion arrives (or with the request, if it never does).
    keep: Option<K>,
}

/// The future's view of its shared state, with the kept value's type erased.
trait FutureSide {
    /// The completion, if it has arrived; otherwise `waker` is woken when it does.
    fn poll_completion(&self, waker: &Waker) -> Option<Completion>;
    /// The future is going away. True if the completion had already arrived (it is dropped
    /// now, and there is nothing to cancel).
    fn abandon(&self) -> bool;
}

/// Both sides of a request's shared state, so that one `Rc` serves as each.
trait OpState: RequestSlot + FutureSide {}

impl<K> OpState for RefCell<OpShared<K>> {}

impl<K> RequestSlot for RefCell<OpShared<K>> {
    fn complete(&self, completion: Completion) {
        let (keep, waker) = {
            let mut st = self.borrow_mut();
            let keep = st.keep.take();
            if st.abandoned {
                // Dropped here, after the engine is done with the memory.
                (keep, None)
            } else {
                st.completion = Some(completion);
                (keep, st.waker.take())
            }
        };
        // Released here: the engine has finished with the request's memory.
        drop(keep);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<K> FutureSide for RefCell<OpShared<K>> {
    fn poll_completion(&self, waker: &Waker) -> Option<Completion> {
        let mut st = self.borrow_mut();
        let done = st.completion.take();
        if done.is_none() && !st.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            st.waker = Some(waker.clone());
        }
        done
    }

    fn abandon(&self) -> bool {
        let mut st = self.borrow_mut();
        if st.completion.take().is_some() {
            return true;
        }
        st.abandoned = true;
        false
    }
}

/// A request in flight as a future of its [`Completion`] (its result and its memory back).
/// Created by [`AttachedEngine::run`] and the op methods; the request is submitted when the
/// future is created. One allocation per request: the state the future shares with the
/// request's delivery.
///
/// The future holds a handle of the engine: [`AttachedEngine::detach`] waits for none to be
/// left.
#[must_use = "dropping the future cancels the request"]
pub struct RequestFuture {
    shared: Rc<dyn OpState>,
    /// The engine and the request's id while it is in flight; a refused request has none.
    in_flight: Option<(Rc<dyn CancelRequest>, RequestId)>,
}

impl std::fmt::Debug for RequestFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestFuture")
            .field("in_flight", &self.in_flight.as_ref().map(|(_, id)| *id))
            .finish()
    }
}

impl Future for RequestFuture {
    type Output = Completion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completion> {
        let this = self.get_mut();
        match this.shared.poll_completion(cx.waker()) {
            Some(c) => {
                this.in_flight = None;
                Poll::Ready(c)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for RequestFuture {
    fn drop(&mut self) {
        let Some((engine, id)) = self.in_flight.take() else {
            return;
        };
        if self.shared.abandon() {
            return; // Completed, never polled again: its memory is freed with it, now.
        }
        // The engine keeps the memory until the kernel or worker is done; its completion (of
        // the request, or of its cancellation) then reaches the shared state, which drops it.
        engine.cancel_request(id);
    }
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> AttachedEngine<L, E> {
    /// Submits `request` and returns the future of its [`Completion`]. A request the engine
    /// refuses completes at once with the refusal as its error (kind as in
    /// [`RequestError`](aio_core::engine::RequestError)'s conversion) and its memory back. The request's
    /// own token is kept in the completion.
    pub fn run(&self, request: Request) -> RequestFuture {
        self.run_keeping(request, ())
    }

    /// [`AttachedEngine::run`], holding `keep` until the engine is done with the request's
    /// memory (its completion, or the discarded late completion of a dropped future): what
    /// must outlive the request's I/O even if the future is dropped early goes here (a count
    /// of writes in flight, say). The hold of a [`LentMemory`] request needs no `keep`: it
    /// travels with the memory, which the engine keeps until then.
    pub fn run_keeping<K: 'static>(&self, request: Request, keep: K) -> RequestFuture {
        let shared = Rc::new(RefCell::new(OpShared {
            completion: None,
            waker: None,
            abandoned: false,
            keep: Some(keep),
        }));
        let slot: Rc<dyn RequestSlot> = shared.clone();
        let in_flight = match self.submit_delivering(request, Delivery::Future(slot)) {
            Ok(id) => Some((self.canceller(), id)),
            Err(refused) => {
                let request = *refused.request;
                let error = io::Error::from(refused.error);
                let mut st = shared.borrow_mut();
                st.completion = Some(request.complete(Err(error)));
                st.keep = None;
                None
            }
        };
        RequestFuture { shared, in_flight }
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`; the buffer comes back with the result.
    pub fn read(
        &self,
        file: &IoFile,
        offset: u64,
        buf: AlignedBuf,
    ) -> impl Future<Output = (io::Result<usize>, AlignedBuf)> + 'static {
        one_buffer(self.run(Request::read(file, offset, buf, 0)))
    }

    /// Writes `buf` at `offset`; the buffer comes back with the result.
    pub fn write(
        &self,
        file: &IoFile,
        offset: u64,
        buf: AlignedBuf,
    ) -> impl Future<Output = (io::Result<usize>, AlignedBuf)> + 'static {
        one_buffer(self.run(Request::write(file, offset, buf, 0)))
    }

    /// A vectored read; the buffers come back with the result.
    pub fn readv(
        &self,
        file: &IoFile,
        offset: u64,
        bufs: Vec<AlignedBuf>,
    ) -> impl Future<Output = (io::Result<usize>, Vec<AlignedBuf>)> + 'static {
        let op = self.run(Request::readv(file, offset, bufs, 0));
        async move {
            let c = op.await;
            (c.result, c.buf.into_vec())
        }
    }

    /// A vectored write; the buffers come back with the result.
    pub fn writev(
        &self,
        file: &IoFile,
        offset: u64,
        bufs: Vec<AlignedBuf>,
    ) -> impl Future<Output = (io::Result<usize>, Vec<AlignedBuf>)> + 'static {
        let op = self.run(Request::writev(file, offset, bufs, 0));
        async move {
            let c = op.await;
            (c.result, c.buf.into_vec())
        }
    }

    /// A read straight into memory the caller lends; the memory comes back with the result
    /// (it is the caller's again once it does, see [`LentMemory`]).
    pub fn read_guest(
        &self,
        file: &IoFile,
        offset: u64,
        mem: LentMemory,
    ) -> impl Future<Output = (io::Result<usize>, LentMemory)> + 'static {
        guest(self.run(Request::read_guest(file, offset, mem, 0)))
    }

    /// A write straight from memory the caller lends; the memory comes back with the result.
    pub fn write_guest(
        &self,
        file: &IoFile,
        offset: u64,
        mem: LentMemory,
    ) -> impl Future<Output = (io::Result<usize>, LentMemory)> + 'static {
        guest(self.run(Request::write_guest(file, offset, mem, 0)))
    }

    /// `fsync(2)`.
    pub fn fsync(&self, file: &IoFile) -> impl Future<Output = io::Result<()>> + 'static {
        unit(self.run(Request::fsync(file, 0)))
    }

    /// `fdatasync(2)`.
    pub fn fdatasync(&self, file: &IoFile) -> impl Future<Output = io::Result<()>> + 'static {
        unit(self.run(Request::fdatasync(file, 0)))
    }

    /// A discard of `len` bytes at `offset` (see [`Op::Discard`](aio_core::engine::Op::Discard)).
    pub fn discard(
        &self,
        file: &IoFile,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = io::Result<()>> + 'static {
        unit(self.run(Request::discard(file, offset, len, 0)))
    }

    /// A write-zeroes of `len` bytes at `offset` (see
    /// [`Op::WriteZeroes`](aio_core::engine::Op::WriteZeroes)).
    pub fn write_zeroes(
        &self,
        file: &IoFile,
        offset: u64,
        len: u64,
        unmap: bool,
    ) -> impl Future<Output = io::Result<()>> + 'static {
        unit(self.run(Request::write_zeroes(file, offset, len, unmap, 0)))
    }
}

async fn one_buffer(op: RequestFuture) -> (io::Result<usize>, AlignedBuf) {
    let c = op.await;
    let buf = match c.buf {
        IoBuffers::One(b) => b,
        // A read or write always comes back with its one buffer.
        other => unreachable!("a single-buffer request came back with {other:?}"),
    };
    (c.result, buf)
}

async fn guest(op: RequestFuture) -> (io::Result<usize>, LentMemory) {
    let c = op.await;
    let mem = match c.buf {
        IoBuffers::Guest(g) => g,
        // A lent-memory request always comes back with its memory.
        other => unreachable!("a guest-memory request came back with {other:?}"),
    };
    (c.result, mem)
}

async fn unit(op: RequestFuture) -> io::Result<()> {
    op.await.result.map(drop)
}
