//! The async part of the loop conformance suite: tasks and the loop's futures on every
//! monitor.
//!
//! This module owns those tests; [`event_loop_conformance!`](crate::event_loop_conformance)
//! runs them with the rest.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::{write_byte, Pipe};
use aio_core::EventLoop;
use aio_loop::task::{readable, sleep, timeout};
use aio_loop::AioContext;

/// A value another thread sets, as a future.
#[derive(Default)]
struct Handoff {
    value: Option<u64>,
    waker: Option<Waker>,
}

struct Receive(Arc<Mutex<Handoff>>);

impl Future for Receive {
    type Output = u64;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u64> {
        let mut h = self.0.lock().expect("handoff");
        match h.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                h.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A task woken from another thread while the loop is blocked in its wait gets polled: the
/// wake goes through the notify path (a notifier write, since the loop is blocked), for 8
/// threads and 200 tasks, each exactly once.
pub fn async_waker_from_another_thread_wakes_a_blocked_loop<L: EventLoop + 'static>(
    make: impl Fn() -> L,
) {
    let ctx = AioContext::new(make()).unwrap();
    let handoffs: Vec<_> = (0..200)
        .map(|_| Arc::new(Mutex::new(Handoff::default())))
        .collect();
    let done = Rc::new(Cell::new(0u64));
    for (i, h) in handoffs.iter().enumerate() {
        let (h, d) = (h.clone(), done.clone());
        ctx.spawn(async move {
            let v = Receive(h).await;
            assert_eq!(v, i as u64);
            d.set(d.get() + 1);
        });
    }
    // The tasks run once and wait.
    while ctx.poll(false) {}
    let writes_before = ctx.counters().notifier_writes;
    // Values first (so the wake always finds one), by index.
    for (i, h) in handoffs.iter().enumerate() {
        h.lock().expect("handoff").value = Some(i as u64);
    }
    // SAFETY: gettid has no preconditions.
    let loop_tid = unsafe { libc::gettid() };
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let mine: Vec<_> = handoffs.iter().skip(t).step_by(8).cloned().collect();
            std::thread::spawn(move || {
                // One wake at least finds the loop blocked in its wait, however the threads
                // are scheduled: the first thread's first wake waits until it sleeps there.
                if t == 0 {
                    assert!(
                        super::wait_until_sleeping(loop_tid, Duration::from_secs(30)),
                        "the loop never blocked"
                    );
                }
                for h in mine {
                    std::thread::sleep(Duration::from_micros(200));
                    // The value is set before the threads start; the task waits for it.
                    let waker = h.lock().expect("handoff").waker.take();
                    waker.expect("the task waits").wake();
                }
            })
        })
        .collect();
    super::poll_until(&ctx, "200 tasks woken from 8 threads", || done.get() == 200);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ctx.task_count(), 0);
    assert!(
        ctx.counters().notifier_writes > writes_before,
        "a blocked loop was woken through its notifier"
    );
}

/// `sleep`, `timeout` and `readable` on this monitor, and `block_on` nested in a task.
pub fn async_sleep_readiness_and_nested_block_on<L: EventLoop + 'static>(make: impl Fn() -> L) {
    let ctx = Rc::new(AioContext::new(make()).unwrap());
    let pipe = Pipe::new();
    let write = pipe.write.try_clone().unwrap();
    let c = ctx.clone();
    let out = ctx.block_on(async move {
        let start = c.now_ns();
        sleep(Duration::from_millis(2)).await.unwrap();
        assert!(c.now_ns() - start >= 2_000_000, "never early");
        assert!(timeout(Duration::from_millis(1), readable(&pipe.read))
            .await
            .is_err());
        let inner = c.spawn(async move {
            sleep(Duration::from_millis(1)).await.unwrap();
            write_byte(&write);
        });
        // Nested: the loop runs the other task while this one waits.
        c.block_on(inner).unwrap();
        readable(&pipe.read).await.unwrap();
        super::drain_fd(&pipe.read)
    });
    assert_eq!(out, 1);
}
