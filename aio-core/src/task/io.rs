//! Engine futures: every engine op as a future on an [`AttachedEngine`], buffers owned by the
//! engine while in flight and handed back with the result (the design of tokio-uring and
//! monoio).
//!
//! This module owns [`RequestFuture`] and its cancellation rule. It builds on the per-request
//! callback of [`AttachedEngine::submit_with`]; it never touches an engine's internals.
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

use crate::engine::{
    AlignedBuf, AttachedEngine, Completion, GuestIovecs, IoBuffers, IoEngine, IoFile, Request,
    RequestId,
};
use crate::event_loop::EventLoop;

/// What a request's callback and its future share.
#[derive(Default)]
struct OpShared {
    completion: Option<Completion>,
    waker: Option<Waker>,
    /// The future was dropped: the callback discards the completion.
    abandoned: bool,
}

/// A request in flight as a future of its [`Completion`] (its result and its memory back).
/// Created by [`AttachedEngine::run`] and the op methods; the request is submitted when the
/// future is created.
///
/// The future holds a handle of the engine: [`AttachedEngine::detach`] waits for none to be
/// left.
#[must_use = "dropping the future cancels the request"]
pub struct RequestFuture<L: EventLoop, E: IoEngine> {
    shared: Rc<RefCell<OpShared>>,
    /// The engine and the request's id while it is in flight; a refused request has none.
    in_flight: Option<(AttachedEngine<L, E>, RequestId)>,
}

impl<L: EventLoop, E: IoEngine> std::fmt::Debug for RequestFuture<L, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestFuture")
            .field("in_flight", &self.in_flight.as_ref().map(|(_, id)| *id))
            .finish()
    }
}

impl<L: EventLoop, E: IoEngine> Future for RequestFuture<L, E> {
    type Output = Completion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completion> {
        let this = self.get_mut();
        let mut shared = this.shared.borrow_mut();
        match shared.completion.take() {
            Some(c) => {
                drop(shared);
                this.in_flight = None;
                Poll::Ready(c)
            }
            None => {
                shared.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<L: EventLoop, E: IoEngine> Drop for RequestFuture<L, E> {
    fn drop(&mut self) {
        let Some((engine, id)) = self.in_flight.take() else {
            return;
        };
        let mut shared = self.shared.borrow_mut();
        if shared.completion.take().is_some() {
            return; // Completed, never polled again: its memory is freed with it, now.
        }
        shared.abandoned = true;
        drop(shared);
        // The engine keeps the memory until the kernel or worker is done; its completion (of
        // the request, or of its cancellation) then reaches the callback, which drops it.
        engine.cancel_request(id);
    }
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> AttachedEngine<L, E> {
    /// Submits `request` and returns the future of its [`Completion`]. A request the engine
    /// refuses completes at once with the refusal as its error (kind as in
    /// [`RequestError`](crate::engine::RequestError)'s conversion) and its memory back. The request's
    /// own token is kept in the completion.
    pub fn run(&self, request: Request) -> RequestFuture<L, E> {
        self.run_keeping(request, ())
    }

    /// [`AttachedEngine::run`], holding `keep` until the engine is done with the request's
    /// memory (its completion, or the discarded late completion of a dropped future): what
    /// keeps caller-owned memory mapped, such as the guest memory table behind a
    /// [`GuestIovecs`] request, goes here, so that dropping the future early never unmaps it
    /// under the kernel.
    pub fn run_keeping<K: 'static>(&self, request: Request, keep: K) -> RequestFuture<L, E> {
        let shared = Rc::new(RefCell::new(OpShared::default()));
        let s = shared.clone();
        let submitted = self.submit_with(request, move |_, _, completion| {
            // Released here: the engine has finished with the request's memory.
            let _keep = keep;
            let waker = {
                let mut st = s.borrow_mut();
                if st.abandoned {
                    return; // Dropped here, after the engine is done with the memory.
                }
                st.completion = Some(completion);
                st.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        });
        let in_flight = match submitted {
            Ok(id) => Some((self.clone(), id)),
            Err(refused) => {
                let request = *refused.request;
                let error = io::Error::from(refused.error);
                shared.borrow_mut().completion = Some(request.complete(Err(error)));
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

    /// A read straight into caller-owned memory; the iovecs come back with the result (the
    /// memory is the caller's again once they do, see [`GuestIovecs`]).
    pub fn read_guest(
        &self,
        file: &IoFile,
        offset: u64,
        mem: GuestIovecs,
    ) -> impl Future<Output = (io::Result<usize>, GuestIovecs)> + 'static {
        guest(self.run(Request::read_guest(file, offset, mem, 0)))
    }

    /// A write straight from caller-owned memory; the iovecs come back with the result.
    pub fn write_guest(
        &self,
        file: &IoFile,
        offset: u64,
        mem: GuestIovecs,
    ) -> impl Future<Output = (io::Result<usize>, GuestIovecs)> + 'static {
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

    /// A discard of `len` bytes at `offset` (see [`Op::Discard`](crate::engine::Op::Discard)).
    pub fn discard(
        &self,
        file: &IoFile,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = io::Result<()>> + 'static {
        unit(self.run(Request::discard(file, offset, len, 0)))
    }

    /// A write-zeroes of `len` bytes at `offset` (see
    /// [`Op::WriteZeroes`](crate::engine::Op::WriteZeroes)).
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

async fn one_buffer<L: EventLoop, E: IoEngine>(
    op: RequestFuture<L, E>,
) -> (io::Result<usize>, AlignedBuf) {
    let c = op.await;
    let buf = match c.buf {
        IoBuffers::One(b) => b,
        // A read or write always comes back with its one buffer.
        other => unreachable!("a single-buffer request came back with {other:?}"),
    };
    (c.result, buf)
}

async fn guest<L: EventLoop, E: IoEngine>(
    op: RequestFuture<L, E>,
) -> (io::Result<usize>, GuestIovecs) {
    let c = op.await;
    let mem = match c.buf {
        IoBuffers::Guest(g) => g,
        // A guest-memory request always comes back with its iovecs.
        other => unreachable!("a guest-memory request came back with {other:?}"),
    };
    (c.result, mem)
}

async fn unit<L: EventLoop, E: IoEngine>(op: RequestFuture<L, E>) -> io::Result<()> {
    op.await.result.map(drop)
}
