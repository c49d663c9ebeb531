//! The executor (`AioContext::spawn`, `block_on`), the timer and readiness futures, over a
//! real monitor.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use aio_backend_poll::PollLoop;

use aio_conformance::FakeClock;
use aio_conformance::{write_byte, Pipe};
use aio_loop::task::{readable, sleep, timeout, JoinError};
use aio_loop::{AioContext, FdHandler};

fn ctx() -> AioContext<PollLoop> {
    AioContext::new(PollLoop::new()).unwrap()
}

#[test]
fn spawned_tasks_run_and_join() {
    let ctx = ctx();
    let order = Rc::new(RefCell::new(Vec::new()));
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let o = order.clone();
            ctx.spawn(async move {
                o.borrow_mut().push(i);
                i * 2
            })
        })
        .collect();
    let mut sum = 0;
    for h in handles {
        sum += ctx.block_on(h).unwrap();
    }
    assert_eq!(sum, (0..100).map(|i| i * 2).sum::<i32>());
    assert_eq!(
        *order.borrow(),
        (0..100).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert_eq!(ctx.task_count(), 0);
}

#[test]
fn a_panicking_task_ends_alone() {
    let ctx = ctx();
    let bad = ctx.spawn(async { panic!("boom") });
    let good = ctx.spawn(async { 7 });
    match ctx.block_on(bad) {
        Err(JoinError::Panicked(msg)) => assert!(msg.contains("boom"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ctx.block_on(good).unwrap(), 7);
}

#[test]
fn detached_tasks_run_to_their_end_and_a_panic_ends_only_its_own() {
    let ctx = ctx();
    let done = Rc::new(Cell::new(0));
    let d = done.clone();
    ctx.spawn_detached(async move {
        // Pending once: woken by the timer, run to its end by the loop alone.
        sleep(Duration::from_millis(1)).await.unwrap();
        d.set(d.get() + 1);
    });
    ctx.spawn_detached(async { panic!("detached boom") });
    let d = done.clone();
    ctx.spawn_detached(async move { d.set(d.get() + 10) });
    assert_eq!(ctx.task_count(), 3);
    while ctx.task_count() > 0 {
        ctx.poll(true);
    }
    assert_eq!(
        done.get(),
        11,
        "both tasks around the panicking one finished"
    );
}

#[test]
fn abort_drops_the_future_and_the_handle_says_so() {
    let ctx = ctx();
    let dropped = Rc::new(Cell::new(false));
    struct Flag(Rc<Cell<bool>>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let flag = Flag(dropped.clone());
    let task = ctx.spawn(async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    });
    while ctx.poll(false) {}
    assert!(!dropped.get());
    task.abort();
    while ctx.poll(false) {}
    assert!(dropped.get(), "the future is dropped in the loop");
    assert!(matches!(ctx.block_on(task), Err(JoinError::Aborted)));
    assert_eq!(ctx.task_count(), 0);
}

/// A one-shot channel whose sender is another thread.
#[derive(Default)]
struct Slot {
    value: Option<u32>,
    waker: Option<Waker>,
}

struct Recv(Arc<Mutex<Slot>>);

impl Future for Recv {
    type Output = u32;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
        let mut s = self.0.lock().unwrap();
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[test]
fn a_waker_on_another_thread_wakes_a_blocked_loop() {
    let ctx = ctx();
    for _ in 0..50 {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let task = ctx.spawn(Recv(slot.clone()));
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            let waker = {
                let mut s = slot.lock().unwrap();
                s.value = Some(5);
                s.waker.take()
            };
            // The loop is (about to be) blocked in poll(true): only the wake can end it.
            if let Some(w) = waker {
                w.wake();
            }
        });
        assert_eq!(ctx.block_on(task).unwrap(), 5);
        sender.join().unwrap();
    }
    assert!(ctx.counters().blocking_waits > 0);
}

#[test]
fn block_on_nested_in_a_task_runs_the_other_tasks() {
    let ctx = Rc::new(ctx());
    let inner_ran = Rc::new(Cell::new(false));
    let (c, ran) = (ctx.clone(), inner_ran.clone());
    let outer = ctx.spawn(async move {
        let r = ran.clone();
        let inner = c.spawn(async move {
            sleep(Duration::from_millis(1)).await.unwrap();
            r.set(true);
            3
        });
        // A nested loop inside a task: the other task must still run.
        let got = c.block_on(inner).unwrap();
        got + 1
    });
    assert_eq!(ctx.block_on(outer).unwrap(), 4);
    assert!(inner_ran.get());
}

#[test]
fn timeout_fires_on_time_with_a_fake_clock_and_never_early() {
    let clock = FakeClock::new(1_000_000);
    let ctx = AioContext::with_clock(PollLoop::new(), Box::new(clock.clone())).unwrap();
    let done = Rc::new(Cell::new(None));
    let d = done.clone();
    let _task = ctx.spawn(async move {
        let r = timeout(Duration::from_micros(500), std::future::pending::<()>()).await;
        d.set(Some(r.is_err()));
    });
    // The timer is armed at 1_000_000 + 500_000 ns.
    for _ in 0..3 {
        ctx.poll(false);
    }
    clock.advance(499_999);
    for _ in 0..3 {
        ctx.poll(false);
    }
    assert_eq!(done.get(), None, "never early");
    clock.advance(1);
    for _ in 0..3 {
        ctx.poll(false);
    }
    assert_eq!(done.get(), Some(true), "elapsed at the deadline");
    // A future that finishes first wins.
    let fast = ctx.block_on(timeout(Duration::from_secs(10), async { 9 }));
    assert_eq!(fast.unwrap(), 9);
}

#[test]
fn readable_completes_when_the_fd_is_readable_and_unregisters() {
    let ctx = ctx();
    let pipe = Pipe::new();
    let read = pipe.read.try_clone().unwrap();
    let write = pipe.write.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2));
        write_byte(&write);
    });
    ctx.block_on(async { readable(&read).await.unwrap() });
    writer.join().unwrap();
    // The watch is gone: the fd can get a handler of its own.
    ctx.set_fd_handler(&read, FdHandler::new().on_read(|_| {}))
        .expect("no handler left behind");
    ctx.remove_fd_handler(&read).unwrap();
    // A readiness future dropped before it fires unregisters too.
    let r = Pipe::new();
    ctx.block_on(async {
        let t = timeout(Duration::from_millis(1), readable(&r.read)).await;
        assert!(t.is_err());
    });
    ctx.set_fd_handler(&r.read, FdHandler::new().on_read(|_| {}))
        .expect("the dropped watch unregistered");
    // Outside a context a loop future says so.
    let mut f = Box::pin(sleep(Duration::from_millis(1)));
    let waker = Waker::noop();
    let polled = f.as_mut().poll(&mut Context::from_waker(waker));
    assert!(matches!(polled, Poll::Ready(Err(_))));
}
