//! A loop on a thread of its own until dropped ([`LoopThread`]: a server the test talks to
//! from its own thread), and the stop that ends a loop from another thread ([`Stop`], set when
//! dropped, so a failed assertion there ends the loop instead of hanging the test).
//!
//! This module owns the thread, the stop and the wake-up that goes with it; what the loop
//! serves, and how it winds down, are the caller's.
//!
//! ```
//! use aio_test_support::loop_thread::LoopThread;
//!
//! let (server, answer) = LoopThread::start(
//!     "server",
//!     |_ctx| (42, ()),
//!     |_ctx, ()| {},
//! );
//! assert_eq!(answer, 42);
//! drop(server); // stops the loop and joins its thread
//! ```

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use aio::poll::PollLoop;
use aio::{AioContext, EventLoop, NotifyHandle};

/// Ends a loop from any thread: [`stop`](Stop::stop), or dropping it (a panic included), sets
/// the flag its [`Stopped`] reads and wakes the loop.
#[derive(Debug)]
pub struct Stop {
    flag: Arc<AtomicBool>,
    wake: NotifyHandle,
}

/// The loop's side of a [`Stop`]: whether it was stopped.
#[derive(Debug, Clone)]
pub struct Stopped(Arc<AtomicBool>);

impl Stop {
    /// A stop for `ctx`'s loop, and what the loop reads.
    pub fn new<L: EventLoop>(ctx: &AioContext<L>) -> (Stop, Stopped) {
        let flag = Arc::new(AtomicBool::new(false));
        let stop = Stop {
            flag: flag.clone(),
            wake: ctx.notify_handle(),
        };
        (stop, Stopped(flag))
    }

    /// Stops the loop: sets the flag, then wakes it (a blocked `poll(true)` returns and the
    /// loop sees the flag).
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.wake.notify();
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Stopped {
    /// Whether the loop was stopped.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Runs `ctx`'s loop (blocking polls) until it is stopped.
    pub fn run<L: EventLoop>(&self, ctx: &AioContext<L>) {
        while !self.is_set() {
            ctx.poll(true);
        }
    }
}

/// A loop on a thread of its own (an `AioContext` over `ppoll`), run until this is dropped;
/// dropping it stops the loop, waits for the thread, and fails the test if the thread
/// panicked (unless the test is already failing).
#[derive(Debug)]
pub struct LoopThread {
    stop: Option<Stop>,
    thread: Option<JoinHandle<()>>,
}

impl LoopThread {
    /// Starts thread `name` with a new context: `setup` runs there first and gives back what
    /// the caller gets (sent across) and what the thread keeps; the loop then runs until the
    /// [`LoopThread`] is dropped, and `finish` gets what was kept (a server to stop, its
    /// clients to drain). A panic in `setup` is this call's.
    pub fn start<R, S>(
        name: &str,
        setup: impl FnOnce(&Rc<AioContext<PollLoop>>) -> (R, S) + Send + 'static,
        finish: impl FnOnce(&AioContext<PollLoop>, S) + Send + 'static,
    ) -> (LoopThread, R)
    where
        R: Send + 'static,
        S: 'static,
    {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let ctx = Rc::new(AioContext::new(PollLoop::new()).expect("a loop over ppoll"));
                let (stop, stopped) = Stop::new(&ctx);
                let (answer, kept) = setup(&ctx);
                if tx.send((answer, stop)).is_err() {
                    return;
                }
                stopped.run(&ctx);
                finish(&ctx, kept);
            })
            .expect("a thread for the loop");
        match rx.recv() {
            Ok((answer, stop)) => (
                LoopThread {
                    stop: Some(stop),
                    thread: Some(thread),
                },
                answer,
            ),
            // The thread ended before it answered: its panic is the caller's.
            Err(_) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => unreachable!("the loop's thread ended without answering"),
            },
        }
    }
}

impl Drop for LoopThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let panicked = thread.join().is_err();
            if !std::thread::panicking() {
                assert!(!panicked, "the loop's thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// The loop serves what the caller sends until dropped, then winds down with what it kept.
    #[test]
    fn a_loop_thread_serves_until_dropped_then_finishes() {
        let (finished_tx, finished_rx) = mpsc::channel();
        let (server, (bh, served)) = LoopThread::start(
            "test-loop",
            |ctx| {
                let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let count = served.clone();
                let bh = ctx.bh_new(move |_| {
                    count.fetch_add(1, Ordering::SeqCst);
                });
                ((bh, served), Rc::new(Cell::new(7)))
            },
            move |_, kept| finished_tx.send(kept.get()).unwrap(),
        );
        for _ in 0..3 {
            let before = served.load(Ordering::SeqCst);
            assert!(bh.schedule());
            while served.load(Ordering::SeqCst) == before {
                std::thread::yield_now();
            }
        }
        drop(server);
        assert_eq!(
            finished_rx.try_recv(),
            Ok(7),
            "finish ran before the drop returned"
        );
    }

    /// A panic in `setup` is the caller's; a stop dropped on another thread ends a loop.
    #[test]
    fn a_failed_setup_fails_the_caller_and_a_dropped_stop_ends_the_loop() {
        let failed = std::panic::catch_unwind(|| {
            LoopThread::start(
                "test-failing",
                |_| -> ((), ()) { panic!("no server") },
                |_, ()| {},
            )
        });
        assert!(failed.is_err());

        let ctx = AioContext::new(PollLoop::new()).unwrap();
        let (stop, stopped) = Stop::new(&ctx);
        let other = std::thread::spawn(move || {
            let _stop = stop;
            panic!("a failed assertion on the other thread");
        });
        stopped.run(&ctx);
        assert!(other.join().is_err());
    }
}
