//! The conformance suite: every behavioural test of the [`EventLoop`] + [`AioContext`]
//! contracts, run by each backend crate against itself.
//!
//! This module owns the tests and their small fixtures (pipes, a watchdog timer). A backend
//! gets the whole suite with one line in `tests/conformance.rs`:
//!
//! ```ignore
//! aio_core::event_loop_conformance!(my_backend::MyLoop::new().unwrap());
//! ```
//!
//! The expression is evaluated once per test (and more often where a test needs several
//! contexts). Tests that block arm a watchdog timer, so a broken backend fails instead of
//! hanging.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::{AioContext, AioError, EventLoop, FdHandler, Notifier, PollParams};

pub mod async_engine;
pub mod contract;
pub mod disk;
pub mod engine;
pub mod engine_loop;
pub mod faults;
pub mod fixtures;
pub mod iothread;
pub mod seccomp;
pub mod send_sync;
pub mod tasks;

/// `AlignedBuf`s allocated minus those freed on this thread so far: a test that allocates
/// and frees on one thread (the loop's) compares it before and after to see that nothing
/// leaked, and in between that nothing was freed early.
pub fn live_buffers() -> isize {
    crate::engine::buf::LIVE_ON_THREAD.with(|n| n.get())
}

/// Whether `AIO_REQUIRE_ALL_BACKENDS=1` is set: a test that would skip for a missing kernel
/// feature fails instead.
pub fn require_all_backends() -> bool {
    std::env::var("AIO_REQUIRE_ALL_BACKENDS").is_ok_and(|v| v == "1")
}

/// A probe's answer for a test: `Some` when the feature is there; otherwise reports the skip
/// (see [`skip`]) with `what` and the probe's reason, and gives `None`.
pub fn available<T, E: std::fmt::Display>(what: &str, probe: Result<T, E>) -> Option<T> {
    match probe {
        Ok(v) => Some(v),
        Err(reason) => {
            skip(&format!("{what}: {reason}"));
            None
        }
    }
}

/// Reports a skipped test: prints `skipped: <reason>`, or panics when
/// `AIO_REQUIRE_ALL_BACKENDS=1` says nothing may be skipped.
pub fn skip(reason: &str) {
    if require_all_backends() {
        panic!("AIO_REQUIRE_ALL_BACKENDS=1 but this test would skip: {reason}");
    }
    println!("skipped: {reason}");
}

/// Generates one `#[test]` per conformance test, each building its monitor with `$make`. With
/// `probe: $probe` (an expression giving `Result<_, impl Display>`), each test first asks
/// whether the kernel supports the monitor and, if not, reports `skipped: <reason>` (a failure
/// under `AIO_REQUIRE_ALL_BACKENDS=1`).
#[macro_export]
macro_rules! event_loop_conformance {
    (probe: $probe:expr, $make:expr) => {
        $crate::event_loop_conformance!(@all ($probe), $make);
    };
    ($make:expr) => {
        $crate::event_loop_conformance!(@all (::std::result::Result::<(), &str>::Ok(())), $make);
    };
    (@all ($probe:expr), $make:expr) => {
        $crate::event_loop_conformance!(@tests ($probe), $make; self_:
            readable_fd_runs_io_read,
            writable_fd_runs_io_write,
            handler_removes_itself_and_another_during_dispatch,
            handler_added_from_callback_runs,
            handler_replaced_from_its_own_callback,
            bottom_halves_from_eight_threads_each_run_once,
            cancelled_bottom_half_does_not_run,
            bottom_half_scheduled_while_bottom_halves_run_waits_for_next_iteration,
            oneshot_and_deleted_bottom_halves,
            idle_bottom_half_runs_in_a_wait_that_blocks,
            timers_fire_in_deadline_order_and_never_early,
            wait_timeout_follows_bottom_halves_and_timers,
            notify_from_another_thread_wakes_blocked_poll,
            no_notifier_write_while_loop_not_blocked,
            io_poll_handler_found_without_blocking_wait,
            handler_without_io_poll_does_not_switch_polling_off,
            nested_poll_loses_and_duplicates_nothing,
            many_registered_fds_one_active,
            fd_closed_while_registered_is_handled,
            eintr_during_wait_is_retried,
            bad_input_gets_typed_errors_and_loop_keeps_running,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; tasks:
            async_waker_from_another_thread_wakes_a_blocked_loop,
            async_sleep_readiness_and_nested_block_on,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; iothread:
            monitor_runs_inside_an_iothread,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; contract:
            monitor_refuses_duplicates_and_unknown_fds,
            one_iteration_runs_bottom_halves_then_handlers_then_timers,
            hang_up_reaches_io_read,
        );
    };
    (@tests ($probe:expr), $make:expr; self_: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if $crate::testing::available(::std::stringify!($name), $probe).is_none() {
                    return;
                }
                $crate::testing::$name(|| $make);
            }
        )*
    };
    (@tests ($probe:expr), $make:expr; $module:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if $crate::testing::available(::std::stringify!($name), $probe).is_none() {
                    return;
                }
                $crate::testing::$module::$name(|| $make);
            }
        )*
    };
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

/// A non-blocking pipe.
#[derive(Debug)]
pub struct Pipe {
    /// The read end.
    pub read: OwnedFd,
    /// The write end.
    pub write: OwnedFd,
}

impl Pipe {
    /// A new non-blocking, close-on-exec pipe.
    pub fn new() -> Pipe {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a writable array of two ints.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
        // SAFETY: both fds are fresh and owned by nobody else.
        unsafe {
            Pipe {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        }
    }

    /// Writes one byte.
    pub fn poke(&self) {
        write_byte(self.write.as_fd());
    }

    /// Reads everything available; returns the byte count.
    pub fn drain(&self) -> usize {
        drain_fd(self.read.as_fd())
    }
}

impl Default for Pipe {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes one byte to `fd`, asserting success.
pub fn write_byte(fd: impl AsFd) {
    let b = 1u8;
    // SAFETY: one byte from a live local, to an fd the caller lends us.
    let r = unsafe { libc::write(fd.as_fd().as_raw_fd(), (&b as *const u8).cast(), 1) };
    assert_eq!(r, 1, "write: {}", std::io::Error::last_os_error());
}

/// Reads `fd` until it would block; returns the byte count.
pub fn drain_fd(fd: impl AsFd) -> usize {
    let fd = fd.as_fd().as_raw_fd();
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r <= 0 {
            return total;
        }
        total += r as usize;
    }
}

/// Raises the soft fd limit to the hard limit (tests open hundreds of pipes).
pub fn raise_fd_limit() -> u64 {
    crate::sys::raise_fd_limit()
}

/// Arms a timer that sets the returned flag after `limit`: a test that blocks checks the flag
/// to fail instead of hanging forever.
pub fn watchdog<L: EventLoop>(ctx: &AioContext<L>, limit: Duration) -> Rc<Cell<bool>> {
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    let t = ctx.timer_new(move |_| f.set(true));
    ctx.timer_mod_in(t, limit).expect("watchdog timer");
    fired
}

/// Polls (blocking) until `done()` or the watchdog fires; panics on the latter.
pub fn poll_until<L: EventLoop>(ctx: &AioContext<L>, what: &str, mut done: impl FnMut() -> bool) {
    let dog = watchdog(ctx, Duration::from_secs(20));
    while !done() {
        assert!(!dog.get(), "timed out waiting for: {what}");
        ctx.poll(true);
    }
}

fn counter() -> Rc<Cell<usize>> {
    Rc::new(Cell::new(0))
}

fn bump(c: &Rc<Cell<usize>>) {
    c.set(c.get() + 1);
}

fn ctx_of<L: EventLoop>(make: &impl Fn() -> L) -> AioContext<L> {
    AioContext::new(make()).expect("context")
}

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
    let slot: Rc<RefCell<Option<crate::BottomHalf>>> = Rc::new(RefCell::new(None));
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
    // A timer 20 ms out: a blocking poll sleeps until it and runs it.
    let hit = Rc::new(Cell::new(false));
    let h = hit.clone();
    let t = ctx.timer_new(move |_| h.set(true));
    ctx.timer_mod_in(t, Duration::from_millis(20)).unwrap();
    let deadline = ctx.timer_deadline(t).unwrap().unwrap();
    poll_until(&ctx, "the timer", || hit.get());
    assert!(ctx.now_ns() >= deadline);
    assert!(ctx.counters().blocking_waits > after.blocking_waits);
}

/// `notify()` from another thread wakes a `poll(true)` that has nothing else to wait for.
pub fn notify_from_another_thread_wakes_blocked_poll<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let handle = ctx.notify_handle();
    let dog = watchdog(&ctx, Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        handle.notify();
        // If the loop missed that one it would hang; keep nudging so the test can report it.
        while !s.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(200));
            handle.notify();
        }
    });
    let started = Instant::now();
    ctx.poll(true);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Release);
    t.join().unwrap();
    assert!(!dog.get(), "the notification never woke the loop");
    assert!(
        elapsed < Duration::from_millis(180),
        "woken by a later nudge, not the first notify ({elapsed:?})"
    );
    let c = ctx.counters();
    assert!(c.notify_calls >= 1);
}

/// With the loop not blocked, notifications and bottom-half schedules from other threads
/// never write the notifier (QEMU's notify_me); they are seen anyway.
pub fn no_notifier_write_while_loop_not_blocked<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let runs = counter();
    let bhs: Vec<_> = (0..64)
        .map(|_| {
            let r = runs.clone();
            ctx.bh_new(move |_| bump(&r))
        })
        .collect();
    let handle = ctx.notify_handle();
    std::thread::spawn(move || {
        for bh in &bhs {
            bh.schedule();
            handle.notify();
        }
    })
    .join()
    .unwrap();
    assert!(ctx.poll(false));
    assert_eq!(runs.get(), 64);
    let c = ctx.counters();
    assert!(c.notify_calls >= 128);
    assert_eq!(
        c.notifier_writes, 0,
        "no eventfd write while the loop was not blocked"
    );
}

/// With polling on, an `io_poll` handler that becomes ready is found by busy polling: no
/// blocking wait, and its fd was never signalled.
pub fn io_poll_handler_found_without_blocking_wait<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    ctx.set_poll_params(PollParams::iothread());
    let doorbell = Notifier::new().unwrap();
    let pending = Rc::new(Cell::new(false));
    let (ready_calls, read_calls) = (counter(), counter());
    let (p, p2, rc, rd) = (
        pending.clone(),
        pending.clone(),
        ready_calls.clone(),
        read_calls.clone(),
    );
    ctx.set_fd_handler(
        doorbell.as_fd(),
        FdHandler::new()
            .on_read(move |_| bump(&rd))
            .on_poll(move || p.get())
            .on_poll_ready(move |_| {
                p2.set(false);
                bump(&rc);
            }),
    )
    .unwrap();
    pending.set(true);
    let before = ctx.counters();
    assert!(ctx.poll(true));
    let after = ctx.counters();
    assert_eq!(ready_calls.get(), 1);
    assert_eq!(read_calls.get(), 0);
    assert_eq!(
        after.blocking_waits, before.blocking_waits,
        "found by polling"
    );
    assert_eq!(after.poll_hits, before.poll_hits + 1);
    assert!(after.poll_set >= 1);
    // Turned off at run time: the same readiness is no longer found without the fd.
    ctx.set_poll_params(PollParams::default());
    assert_eq!(ctx.counters().poll_ns, 0);
    pending.set(true);
    assert!(!ctx.poll(false), "polling off and the fd never signalled");
}

/// A handler without `io_poll` next to one with it: polling still works, and the counters say
/// which handlers it does not cover.
pub fn handler_without_io_poll_does_not_switch_polling_off<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    ctx.set_poll_params(PollParams::iothread());
    let plain = Pipe::new();
    ctx.set_fd_handler(plain.read.as_fd(), FdHandler::new().on_read(|_| {}))
        .unwrap();
    let doorbell = Notifier::new().unwrap();
    let pending = Rc::new(Cell::new(true));
    let ready = counter();
    let (p, p2, r) = (pending.clone(), pending.clone(), ready.clone());
    ctx.set_fd_handler(
        doorbell.as_fd(),
        FdHandler::new()
            .on_poll(move || p.get())
            .on_poll_ready(move |_| {
                p2.set(false);
                bump(&r);
            }),
    )
    .unwrap();
    let before = ctx.counters();
    assert!(ctx.poll(true));
    let after = ctx.counters();
    assert_eq!(ready.get(), 1);
    assert_eq!(after.poll_hits, before.poll_hits + 1);
    assert_eq!(after.blocking_waits, before.blocking_waits);
    assert_eq!(
        after.unpolled_handlers, 1,
        "the plain pipe is served by the monitor"
    );
    assert_eq!(after.poll_set, 1);
    // The plain handler is still served: its fd is checked without blocking.
    assert!(after.nonblocking_waits > before.nonblocking_waits);
}

/// A callback runs a nested `poll()`: other handlers, bottom halves and timers run inside it,
/// the running callback is not re-entered, and nothing runs twice or gets lost.
pub fn nested_poll_loses_and_duplicates_nothing<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let a = Rc::new(Pipe::new());
    let b = Rc::new(Pipe::new());
    let (a_calls, b_calls, bh_runs, timer_runs) = (counter(), counter(), counter(), counter());
    let r = bh_runs.clone();
    let bh = ctx.bh_new(move |_| bump(&r));
    let r = timer_runs.clone();
    let timer = ctx.timer_new(move |_| bump(&r));
    let (ac, a2) = (a_calls.clone(), a.clone());
    let nested_progress = Rc::new(Cell::new(false));
    let np = nested_progress.clone();
    ctx.set_fd_handler(
        a.read.as_fd(),
        FdHandler::new().on_read(move |ctx| {
            bump(&ac);
            bh.schedule();
            ctx.timer_mod(timer, 0).unwrap();
            // Nested loop: a is still readable (not drained yet) but must not be re-entered.
            let mut any = false;
            for _ in 0..3 {
                any |= ctx.poll(false);
            }
            np.set(any);
            a2.drain();
        }),
    )
    .unwrap();
    let (bc, b2) = (b_calls.clone(), b.clone());
    ctx.set_fd_handler(
        b.read.as_fd(),
        FdHandler::new().on_read(move |_| {
            bump(&bc);
            b2.drain();
        }),
    )
    .unwrap();
    a.poke();
    b.poke();
    poll_until(&ctx, "a's handler", || a_calls.get() == 1);
    while ctx.poll(false) {}
    assert!(nested_progress.get());
    assert_eq!(a_calls.get(), 1, "not re-entered, not repeated");
    assert_eq!(b_calls.get(), 1);
    assert_eq!(bh_runs.get(), 1);
    assert_eq!(timer_runs.get(), 1);
    assert!(ctx.counters().max_nesting >= 2);
}

/// 256 registered fds, one active: only its handler runs.
pub fn many_registered_fds_one_active<L: EventLoop>(make: impl Fn() -> L) {
    raise_fd_limit();
    let ctx = ctx_of(&make);
    let pipes: Vec<Rc<Pipe>> = (0..256).map(|_| Rc::new(Pipe::new())).collect();
    let calls: Rc<RefCell<Vec<usize>>> = Rc::new(RefCell::new(vec![0; pipes.len()]));
    for (i, p) in pipes.iter().enumerate() {
        let (c, p2) = (calls.clone(), p.clone());
        ctx.set_fd_handler(
            p.read.as_fd(),
            FdHandler::new().on_read(move |_| {
                c.borrow_mut()[i] += 1;
                p2.drain();
            }),
        )
        .unwrap();
    }
    assert_eq!(ctx.fd_handler_count(), 256);
    for round in 0..3 {
        let active = [7, 200, 255][round];
        pipes[active].poke();
        poll_until(&ctx, "the active fd", || calls.borrow()[active] == 1);
        assert_eq!(calls.borrow().iter().sum::<usize>(), round + 1);
    }
    for p in &pipes {
        ctx.remove_fd_handler(p.read.as_fd()).unwrap();
    }
    assert_eq!(ctx.fd_handler_count(), 0);
}

/// An fd closed while registered: no panic, no busy loop; where the monitor can see it, its
/// handler hears of it once; the handler can still be removed.
pub fn fd_closed_while_registered_is_handled<L: EventLoop>(make: impl Fn() -> L) {
    let limit = raise_fd_limit();
    let ctx = ctx_of(&make);
    let pipe = Pipe::new();
    pipe.poke();
    // Move the read end to a high fd number so that other tests running in parallel do not
    // get the number back from the kernel after we close it.
    let base = (limit / 2).clamp(64, 60_000);
    let spread = (limit / 4).clamp(1, 997);
    let floor = (base + u64::from(std::process::id()) % spread) as libc::c_int;
    // SAFETY: F_DUPFD_CLOEXEC duplicates a valid fd onto the lowest free number >= floor.
    let high = unsafe { libc::fcntl(pipe.read.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    assert!(high >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: `high` is a fresh descriptor owned by nobody else.
    let high = unsafe { OwnedFd::from_raw_fd(high) };
    let high_number = high.as_raw_fd();
    let Pipe { read, write } = pipe;
    drop(read);
    let calls = counter();
    let c = calls.clone();
    ctx.set_fd_handler(&high, FdHandler::new().on_read(move |_| bump(&c)))
        .unwrap();
    assert!(ctx.poll(false));
    assert_eq!(calls.get(), 1);
    // Closed while its handler is installed (what the contract tells users not to do).
    drop(high);
    let reports = ctx.with_monitor(|m| m.reports_closed_fds());
    for _ in 0..5 {
        ctx.poll(false);
    }
    let expected = if reports { 2 } else { 1 };
    assert_eq!(
        calls.get(),
        expected,
        "reported once (reports_closed_fds = {reports}), never again"
    );
    assert_eq!(ctx.counters().closed_fds, u64::from(reports));
    assert!(!ctx.poll(false), "no busy loop on a closed fd");
    // It can no longer be named by a live fd: forgotten by number.
    assert_eq!(ctx.fd_handler_count(), 1);
    ctx.forget_closed_fd(high_number).unwrap();
    assert_eq!(ctx.fd_handler_count(), 0);
    assert!(matches!(
        ctx.forget_closed_fd(high_number),
        Err(AioError::NotRegistered { .. })
    ));
    drop(write);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// A signal that interrupts the wait (`EINTR`) is retried: the loop keeps waiting for the
/// event it was waiting for.
pub fn eintr_during_wait_is_retried<L: EventLoop>(make: impl Fn() -> L) {
    // SAFETY: installs a no-op handler for SIGURG without SA_RESTART; the handler is
    // async-signal-safe (it does nothing). SIGURG is ignored by default, so a stray one is
    // harmless to other tests.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as *const () as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut());
    }
    let ctx = ctx_of(&make);
    let pipe = Rc::new(Pipe::new());
    let got = counter();
    let (g, p) = (got.clone(), pipe.clone());
    ctx.set_fd_handler(
        pipe.read.as_fd(),
        FdHandler::new().on_read(move |_| {
            bump(&g);
            p.drain();
        }),
    )
    .unwrap();
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    let write_fd = pipe.write.try_clone().unwrap();
    let signals = Arc::new(AtomicUsize::new(0));
    let s = signals.clone();
    let t = std::thread::spawn(move || {
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(10));
            // SAFETY: `me` is the test thread, alive until it joins this thread.
            unsafe { libc::pthread_kill(me, libc::SIGURG) };
            s.fetch_add(1, Ordering::Relaxed);
        }
        write_byte(&write_fd);
    });
    poll_until(&ctx, "the byte after the signals", || got.get() == 1);
    t.join().unwrap();
    assert_eq!(signals.load(Ordering::Relaxed), 10);
    assert!(
        ctx.counters().wait_retries >= 1,
        "no wait was interrupted: {:?}",
        ctx.counters()
    );
}

/// Bad input: typed errors, no panic, and the loop keeps working.
pub fn bad_input_gets_typed_errors_and_loop_keeps_running<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let pipe = Pipe::new();
    let fd = pipe.read.as_fd();
    ctx.set_fd_handler(fd, FdHandler::new().on_read(|_| {}))
        .unwrap();
    let again = ctx.set_fd_handler(fd, FdHandler::new().on_read(|_| {}));
    assert!(matches!(again, Err(AioError::AlreadyRegistered { fd: f }) if f == fd.as_raw_fd()));
    assert!(matches!(
        ctx.set_fd_handler(pipe.write.as_fd(), FdHandler::new()),
        Err(AioError::NoCallbacks { .. })
    ));
    assert!(matches!(
        ctx.remove_fd_handler(pipe.write.as_fd()),
        Err(AioError::NotRegistered { .. })
    ));
    assert!(matches!(
        ctx.update_fd_handler(pipe.write.as_fd(), FdHandler::new().on_read(|_| {})),
        Err(AioError::NotRegistered { .. })
    ));
    let t = ctx.timer_new(|_| {});
    let overflow = ctx.timer_mod_in(t, Duration::MAX);
    assert!(matches!(overflow, Err(AioError::TimeoutOverflow { .. })));
    let io: std::io::Error = overflow.unwrap_err().into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    ctx.timer_free(t).unwrap();
    assert!(matches!(
        ctx.timer_mod(t, 0),
        Err(AioError::UnknownTimer { .. })
    ));
    assert!(matches!(
        ctx.timer_free(t),
        Err(AioError::UnknownTimer { .. })
    ));
    // Still running: a bottom half and the fd both work.
    let ran = Rc::new(Cell::new(false));
    let r = ran.clone();
    ctx.bh_schedule_oneshot(move |_| r.set(true));
    pipe.poke();
    assert!(ctx.poll(false));
    assert!(ran.get());
    ctx.remove_fd_handler(fd).unwrap();
}
