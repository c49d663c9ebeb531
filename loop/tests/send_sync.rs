//! The thread safety each public type of aio-core documents, pinned at compile time.

use aio_backend_poll::PollLoop;
use aio_core::engine::{
    AlignedBuf, Completion, IoFile, LentMemory, Request, RequestError, ReturnedBuf, RwFlags,
    SubmitError, WithFallback,
};
use aio_core::{AioError, Notifier};
use aio_loop::task::{JoinHandle, RequestFuture, Sleep};
use aio_loop::AttachedEngine;
use aio_loop::{
    AioContext, BottomHalf, IoThread, IoThreadHandle, LoopCounters, NotifyHandle, PollParams,
};
use aio_pool::ThreadPool;

// Cross-thread by design: the ways other threads reach a loop, and request data.
aio_conformance::assert_thread_safe!(send_sync:
    Notifier, NotifyHandle, BottomHalf, IoFile, AlignedBuf, LentMemory, ReturnedBuf, Request, Completion,
    RwFlags, RequestError, SubmitError, AioError, LoopCounters, PollParams,
    IoThread<PollLoop, ()>, IoThreadHandle<PollLoop, ()>,
);

// Engines and monitors may be built on one thread and run on another.
aio_conformance::assert_thread_safe!(send_sync: ThreadPool, WithFallback<ThreadPool, ThreadPool>, PollLoop);

// Loop-thread objects: `Rc` and `Cell` inside, by design (one loop, one thread; other
// threads use NotifyHandle, BottomHalf and IoThreadHandle).
aio_conformance::assert_not_thread_safe!(not_send:
    AioContext<PollLoop>, AttachedEngine<PollLoop, ThreadPool>, JoinHandle<()>,
    RequestFuture, Sleep, aio_pool::PoolContext<PollLoop>,
);
aio_conformance::assert_not_thread_safe!(not_sync: AioContext<PollLoop>);

#[test]
fn thread_safety_is_pinned_at_compile_time() {
    // The assertions above are checked when this file compiles; nothing to run.
}
