//! The event-loop suite's tests of dispatch: fd handlers (added, removed and replaced from
//! callbacks), bottom halves (from other threads, cancelled, one-shot, idle) and timers.
//!
//! This module owns those tests, never a fixture (those are in the parent module); the tests
//! of waiting (notify, adaptive polling, nested `poll()`, many fds, EINTR, bad input) are in
//! `event_loop_wait`.

use std::cell::{Cell, RefCell};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::{bump, counter, ctx_of, poll_until, Pipe};
use aio_core::{AioError, EventLoop};
use aio_loop::FdHandler;

/// A readable fd runs `io_read`; an idle one does not.
pub fn readable_fd_runs_io_read<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let pipe = Rc::new(Pipe::new());
    let reads = counter();
    let (r, p) = (reads.clone(), pipe.clone());
    ctx.set_fd_handler(
        pipe.read.as_fd(),
        FdHandler::new().on_read(move |_| {
            bump(&r);
            p.drain();
        }),
    )
    .unwrap();
    assert!(!ctx.poll(false), "nothing is ready yet");
    assert_eq!(reads.get(), 0);
    pipe.poke();
    assert!(ctx.poll(false));
    assert_eq!(reads.get(), 1);
    assert!(!ctx.poll(false), "drained: not ready any more");
    assert_eq!(reads.get(), 1);
    pipe.poke();
    poll_until(&ctx, "second read", || reads.get() == 2);
}

/// A writable fd runs `io_write`.
pub fn writable_fd_runs_io_write<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let pipe = Rc::new(Pipe::new());
    let writes = counter();
    let (w, p) = (writes.clone(), pipe.clone());
    ctx.set_fd_handler(
        &pipe.write,
        FdHandler::new().on_write(move |ctx| {
            bump(&w);
            ctx.remove_fd_handler(&p.write).unwrap();
        }),
    )
    .unwrap();
    assert!(ctx.poll(false), "an empty pipe is writable");
    assert_eq!(writes.get(), 1);
    assert!(!ctx.poll(false), "removed from its own callback");
    assert_eq!(writes.get(), 1);
}

/// Each handler removes both itself and the other one: exactly one of them ever runs.
pub fn handler_removes_itself_and_another_during_dispatch<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let pipes = [Rc::new(Pipe::new()), Rc::new(Pipe::new())];
    for p in &pipes {
        p.poke();
    }
    let calls = counter();
    for p in &pipes {
        let (c, both) = (calls.clone(), pipes.clone());
        ctx.set_fd_handler(
            &p.read,
            FdHandler::new().on_read(move |ctx| {
                bump(&c);
                for p in &both {
                    ctx.remove_fd_handler(&p.read).unwrap();
                }
            }),
        )
        .unwrap();
    }
    ctx.poll(false);
    ctx.poll(false);
    ctx.poll(false);
    assert_eq!(calls.get(), 1, "a removed handler never runs again");
    assert_eq!(ctx.fd_handler_count(), 0);
    assert!(matches!(
        ctx.remove_fd_handler(&pipes[0].read),
        Err(AioError::NotRegistered { .. })
    ));
}

/// A handler installed from a callback runs.
pub fn handler_added_from_callback_runs<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let a = Rc::new(Pipe::new());
    let b = Rc::new(Pipe::new());
    b.poke();
    let b_calls = counter();
    let (bc, a2, b2) = (b_calls.clone(), a.clone(), b.clone());
    ctx.set_fd_handler(
        a.read.as_fd(),
        FdHandler::new().on_read(move |ctx| {
            a2.drain();
            let (bc, b3) = (bc.clone(), b2.clone());
            if !ctx.has_fd_handler(b2.read.as_fd()) {
                ctx.set_fd_handler(
                    b2.read.as_fd(),
                    FdHandler::new().on_read(move |_| {
                        bump(&bc);
                        b3.drain();
                    }),
                )
                .unwrap();
            }
        }),
    )
    .unwrap();
    a.poke();
    poll_until(&ctx, "handler added from a callback", || b_calls.get() == 1);
    assert!(!ctx.poll(false));
    assert_eq!(b_calls.get(), 1);
}

/// A handler replaces its own callbacks from inside `io_read`; the new ones run afterwards.
pub fn handler_replaced_from_its_own_callback<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let pipe = Rc::new(Pipe::new());
    let old_calls = counter();
    let new_calls = counter();
    let (o, n, p) = (old_calls.clone(), new_calls.clone(), pipe.clone());
    ctx.set_fd_handler(
        &pipe.read,
        FdHandler::new().on_read(move |ctx| {
            bump(&o);
            p.drain();
            let (n, p2) = (n.clone(), p.clone());
            ctx.update_fd_handler(
                &p.read,
                FdHandler::new().on_read(move |_| {
                    bump(&n);
                    p2.drain();
                }),
            )
            .unwrap();
        }),
    )
    .unwrap();
    pipe.poke();
    assert!(ctx.poll(false));
    pipe.poke();
    assert!(ctx.poll(false));
    pipe.poke();
    assert!(ctx.poll(false));
    assert_eq!((old_calls.get(), new_calls.get()), (1, 2));
}

/// 8 threads each schedule their own bottom halves concurrently while the loop blocks; every
/// one runs exactly once.
pub fn bottom_halves_from_eight_threads_each_run_once<L: EventLoop>(make: impl Fn() -> L) {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 250;
    let ctx = ctx_of(&make);
    let runs: Rc<RefCell<Vec<usize>>> = Rc::new(RefCell::new(vec![0; THREADS * PER_THREAD]));
    let total = counter();
    let mut handles = Vec::new();
    for i in 0..THREADS * PER_THREAD {
        let (r, t) = (runs.clone(), total.clone());
        handles.push(ctx.bh_new(move |_| {
            r.borrow_mut()[i] += 1;
            bump(&t);
        }));
    }
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = handles
        .chunks(PER_THREAD)
        .map(|chunk| {
            let chunk = chunk.to_vec();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for (k, bh) in chunk.iter().enumerate() {
                    assert!(bh.schedule());
                    if k % 32 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    poll_until(&ctx, "all bottom halves", || {
        total.get() == THREADS * PER_THREAD
    });
    for t in threads {
        t.join().unwrap();
    }
    while ctx.poll(false) {}
    assert_eq!(total.get(), THREADS * PER_THREAD, "nothing ran twice");
    assert!(runs.borrow().iter().all(|&n| n == 1));
    assert_eq!(ctx.counters().bh_runs, (THREADS * PER_THREAD) as u64);
}

/// A cancelled schedule does not run; a later schedule does.
pub fn cancelled_bottom_half_does_not_run<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let runs = counter();
    let r = runs.clone();
    let bh = ctx.bh_new(move |_| bump(&r));
    assert!(bh.schedule());
    assert!(bh.is_scheduled());
    assert!(bh.cancel());
    assert!(!bh.cancel(), "nothing left to cancel");
    assert!(!ctx.poll(false));
    assert_eq!(runs.get(), 0);
    bh.schedule();
    assert!(ctx.poll(false));
    assert_eq!(runs.get(), 1);
}

/// A bottom half scheduled while bottom halves run (by itself or another one) waits for the
/// next iteration.
pub fn bottom_half_scheduled_while_bottom_halves_run_waits_for_next_iteration<L: EventLoop>(
    make: impl Fn() -> L,
) {
    let ctx = ctx_of(&make);
    let log: Rc<RefCell<Vec<&'static str>>> = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    let second = ctx.bh_new(move |_| l.borrow_mut().push("second"));
    let l = log.clone();
    let again = Rc::new(Cell::new(true));
    let slot: Rc<RefCell<Option<aio_loop::BottomHalf>>> = Rc::new(RefCell::new(None));
    let s = slot.clone();
    let first = ctx.bh_new(move |_| {
        l.borrow_mut().push("first");
        second.schedule();
        if again.replace(false) {
            s.borrow().as_ref().unwrap().schedule();
        }
    });
    *slot.borrow_mut() = Some(first.clone());
    first.schedule();
    assert!(ctx.poll(false));
    assert_eq!(*log.borrow(), ["first"]);
    assert!(ctx.poll(false));
    log.borrow_mut().sort();
    assert_eq!(*log.borrow(), ["first", "first", "second"]);
    assert!(
        ctx.poll(false),
        "second was scheduled again by first's second run"
    );
    assert!(!ctx.poll(false));
    assert_eq!(log.borrow().len(), 4);
}

/// A one-shot bottom half runs once and is freed; a deleted one never runs.
pub fn oneshot_and_deleted_bottom_halves<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let runs = counter();
    let r = runs.clone();
    let dropped = Rc::new(Cell::new(false));
    struct SetOnDrop(Rc<Cell<bool>>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let guard = SetOnDrop(dropped.clone());
    ctx.bh_schedule_oneshot(move |_| {
        let _g = guard;
        bump(&r);
    });
    assert!(ctx.poll(false));
    assert_eq!(runs.get(), 1);
    assert!(
        dropped.get(),
        "a one-shot bottom half is freed after it runs"
    );
    assert!(!ctx.poll(false));

    let r = runs.clone();
    let bh = ctx.bh_new(move |_| bump(&r));
    bh.schedule();
    assert!(bh.delete());
    assert!(!bh.delete());
    assert!(!bh.schedule(), "a deleted bottom half cannot be scheduled");
    ctx.poll(false);
    ctx.poll(false);
    assert_eq!(runs.get(), 1);
    assert!(matches!(
        ctx.bh_delete(&bh),
        Err(AioError::UnknownBottomHalf { .. })
    ));
}

/// Timers fire in deadline order, each at or after its deadline.
pub fn timers_fire_in_deadline_order_and_never_early<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let fired: Rc<RefCell<Vec<(u32, u64, u64)>>> = Rc::new(RefCell::new(Vec::new()));
    let base = ctx.now_ns();
    for (name, ms) in [(3u32, 30u64), (1, 10), (2, 20), (4, 30)] {
        let f = fired.clone();
        let deadline = base + ms * 1_000_000;
        let t = ctx.timer_new(move |ctx| f.borrow_mut().push((name, deadline, ctx.now_ns())));
        ctx.timer_mod(t, deadline).unwrap();
    }
    // Re-arming replaces the deadline; a deleted timer never fires.
    let f = fired.clone();
    let moved = ctx.timer_new(move |ctx| f.borrow_mut().push((5, 0, ctx.now_ns())));
    ctx.timer_mod(moved, base + 5_000_000).unwrap();
    ctx.timer_mod(moved, base + 40_000_000).unwrap();
    let f = fired.clone();
    let deleted = ctx.timer_new(move |ctx| f.borrow_mut().push((6, 0, ctx.now_ns())));
    ctx.timer_mod(deleted, base + 15_000_000).unwrap();
    ctx.timer_del(deleted).unwrap();
    assert_eq!(ctx.timer_deadline(deleted).unwrap(), None);

    poll_until(&ctx, "five timers", || fired.borrow().len() == 5);
    let fired = fired.borrow();
    let order: Vec<u32> = fired.iter().map(|f| f.0).collect();
    assert_eq!(
        order,
        [1, 2, 3, 4, 5],
        "deadline order, ties in arming order"
    );
    for &(name, deadline, at) in fired.iter().take(4) {
        assert!(
            at >= deadline,
            "timer {name} fired {} ns early",
            deadline - at
        );
    }
    assert!(
        fired[4].2 >= base + 40_000_000,
        "re-armed timer used its new deadline"
    );
}

/// The wait timeout is 0 with a bottom half pending, else up to the earliest timer.
pub fn wait_timeout_follows_bottom_halves_and_timers<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    // A pending bottom half: a blocking poll must not block.
    let bh = ctx.bh_new(|_| {});
    bh.schedule();
    let before = ctx.counters();
    assert!(ctx.poll(true));
    let after = ctx.counters();
    assert_eq!(
        after.blocking_waits, before.blocking_waits,
        "BH pending: timeout 0"
    );
    // A timer 200 ms out: a blocking poll sleeps until it and runs it (far enough out that a
    // thread preempted before its poll still finds time left to wait).
    let hit = Rc::new(Cell::new(false));
    let h = hit.clone();
    let t = ctx.timer_new(move |_| h.set(true));
    ctx.timer_mod_in(t, Duration::from_millis(200)).unwrap();
    let deadline = ctx.timer_deadline(t).unwrap().unwrap();
    poll_until(&ctx, "the timer", || hit.get());
    assert!(ctx.now_ns() >= deadline);
    assert!(ctx.counters().blocking_waits > after.blocking_waits);
}

/// An idle bottom half (QEMU's `qemu_bh_schedule_idle`) runs in a blocking `poll` that really
/// waits on the monitor (with the 10 ms cap, not a zero timeout), also when scheduled from
/// another thread; an urgent schedule of it does not wait.
pub fn idle_bottom_half_runs_in_a_wait_that_blocks<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let runs = counter();
    let r = runs.clone();
    let bh = ctx.bh_new(move |_| bump(&r));
    for from_another_thread in [false, true] {
        let before = ctx.counters();
        if from_another_thread {
            let b = bh.clone();
            std::thread::spawn(move || assert!(b.schedule_idle()))
                .join()
                .unwrap();
        } else {
            assert!(bh.schedule_idle());
        }
        poll_until(&ctx, "the idle bottom half", || {
            runs.get() == 1 + usize::from(from_another_thread)
        });
        let after = ctx.counters();
        assert!(
            after.blocking_waits > before.blocking_waits,
            "an idle bottom half must not make the wait non-blocking: {after:?}"
        );
    }
    let before = ctx.counters();
    assert!(bh.schedule_idle());
    assert!(bh.schedule(), "urgent now");
    assert!(ctx.poll(true));
    assert_eq!(runs.get(), 3);
    assert_eq!(
        ctx.counters().blocking_waits,
        before.blocking_waits,
        "did not wait"
    );
}
