//! The event-loop suite's tests of waiting: cross-thread notify and the notify_me rule,
//! adaptive polling, nested `poll()`, many registered fds, an fd closed while registered,
//! EINTR, and bad input.
//!
//! This module owns those tests, never a fixture (those are in the parent module).

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    bump, counter, ctx_of, poll_until, raise_fd_limit, wait_until_sleeping, watchdog, write_byte,
    Pipe,
};
use aio_core::{AioError, EventLoop, Notifier};
use aio_loop::{FdHandler, PollParams};

/// `notify()` from another thread wakes a `poll(true)` that has nothing else to wait for.
/// The other thread notifies once the loop's thread sleeps in its wait (a handshake on the
/// thread's state in `/proc`, not a sleep), and the counters show the notifier was written:
/// the blocked path, not a notification that came first.
pub fn notify_from_another_thread_wakes_blocked_poll<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = ctx_of(&make);
    let handle = ctx.notify_handle();
    let dog = watchdog(&ctx, Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // SAFETY: gettid has no preconditions.
    let loop_tid = unsafe { libc::gettid() };
    let t = std::thread::spawn(move || {
        let blocked = wait_until_sleeping(loop_tid, Duration::from_secs(30));
        handle.notify();
        // If the loop missed that one it would hang: after 30 s, nudge it so the test fails
        // instead, and count the nudges.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut nudges = 0;
        while !s.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            if Instant::now() > deadline {
                nudges += 1;
                handle.notify();
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        (blocked, nudges)
    });
    ctx.poll(true);
    stop.store(true, Ordering::Release);
    let (blocked, nudges) = t.join().unwrap();
    assert!(blocked, "the loop's thread never slept in its wait");
    assert!(!dog.get(), "the notification never woke the loop");
    assert_eq!(nudges, 0, "woken by a later nudge, not the first notify");
    let c = ctx.counters();
    assert!(c.notify_calls >= 1);
    assert!(
        c.notifier_writes >= 1,
        "a notify while the loop sleeps writes the notifier"
    );
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

/// A signal that interrupts the wait (`EINTR`) is retried: the loop keeps waiting for the
/// event it was waiting for.
pub fn eintr_during_wait_is_retried<L: EventLoop>(make: impl Fn() -> L) {
    super::interrupt_with_sigurg();
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
    // SAFETY: pthread_self and gettid have no preconditions.
    let (me, tid) = unsafe { (libc::pthread_self(), libc::gettid()) };
    let write_fd = pipe.write.try_clone().unwrap();
    let signals = Arc::new(AtomicUsize::new(0));
    let s = signals.clone();
    let t = std::thread::spawn(move || {
        for _ in 0..10 {
            // Each signal finds the loop in its wait (its only sleep), however the two
            // threads are scheduled.
            assert!(
                wait_until_sleeping(tid, Duration::from_secs(30)),
                "the loop never waited"
            );
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

/// Polling mode (QEMU's `io_poll_begin` / `io_poll_end`): `io_poll_begin` runs when busy
/// polling finds the handler's work; an iteration that does not find work by polling ends the
/// mode (`io_poll_end`) and checks `io_poll` once more, so work queued while the guest was told
/// not to notify (here by `io_poll_end` itself) runs without a notification and without
/// blocking; a handler removed in polling mode gets `io_poll_end` at once.
pub fn io_poll_begin_and_end_bracket_polling_mode<L: EventLoop>(make: impl Fn() -> L) {
    let handler = logging_poll_handler::<L>;
    let ctx = ctx_of(&make);
    ctx.set_poll_params(PollParams::iothread());
    let dog = watchdog(&ctx, Duration::from_secs(20));
    let doorbell = Notifier::new().unwrap();
    let (pending, late) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(false)));
    let log: Log = Rc::default();
    ctx.set_fd_handler(doorbell.as_fd(), handler(&pending, &late, &log))
        .unwrap();
    // Found by polling: the mode begins, and stays on after the hit.
    pending.set(true);
    assert!(ctx.poll(true));
    assert_eq!(*log.borrow(), ["begin", "ready"]);
    // Nothing found by polling: the mode ends, and the last check finds what io_poll_end
    // queued (no notification was sent: without that check this poll would block).
    log.borrow_mut().clear();
    late.set(true);
    assert!(ctx.poll(true));
    assert!(
        !dog.get(),
        "blocked: the last check after io_poll_end missed the work"
    );
    assert_eq!(*log.borrow(), ["end", "ready"]);

    // A fresh context: an iteration that does not poll ends the mode too, and a handler
    // removed in polling mode gets io_poll_end at once. Its window may grow but never falls
    // to nothing (a thread preempted in a hit iteration measures a wait longer than QEMU's
    // 32 µs, which would reset it, and the next poll(true) would not poll); a watchdog of its
    // own turns a hang into a failure.
    let ctx = ctx_of(&make);
    ctx.set_poll_params(PollParams::iothread().with_max_ns(1_000_000_000));
    let _dog = watchdog(&ctx, Duration::from_secs(20));
    log.borrow_mut().clear();
    ctx.set_fd_handler(doorbell.as_fd(), handler(&pending, &late, &log))
        .unwrap();
    pending.set(true);
    assert!(ctx.poll(true));
    assert!(!ctx.poll(false));
    assert_eq!(*log.borrow(), ["begin", "ready", "end"]);
    log.borrow_mut().clear();
    pending.set(true);
    assert!(ctx.poll(true));
    ctx.remove_fd_handler(doorbell.as_fd()).unwrap();
    assert_eq!(*log.borrow(), ["begin", "ready", "end"]);

    // A handler replaced in polling mode (update_fd_handler) is ended at once too: the new
    // one starts outside the mode and begins it on its own.
    let other_log: Log = Rc::default();
    log.borrow_mut().clear();
    ctx.set_fd_handler(doorbell.as_fd(), handler(&pending, &late, &log))
        .unwrap();
    pending.set(true);
    assert!(ctx.poll(true));
    assert_eq!(*log.borrow(), ["begin", "ready"]);
    ctx.update_fd_handler(doorbell.as_fd(), handler(&pending, &late, &other_log))
        .unwrap();
    assert_eq!(
        *log.borrow(),
        ["begin", "ready", "end"],
        "the replaced handler was not ended"
    );
    pending.set(true);
    assert!(ctx.poll(true));
    assert_eq!(*other_log.borrow(), ["begin", "ready"]);
    ctx.remove_fd_handler(doorbell.as_fd()).unwrap();
}

/// What the polling-mode handler of [`io_poll_begin_and_end_bracket_polling_mode`] logged.
type Log = Rc<std::cell::RefCell<Vec<&'static str>>>;

/// A handler whose `io_poll` finds work while `pending` is set (its `poll_ready` clears it),
/// logging each callback to `log`; its `io_poll_end` sets `pending` again if `late` was set
/// (work queued while the guest was told not to notify).
fn logging_poll_handler<L: EventLoop>(
    pending: &Rc<Cell<bool>>,
    late: &Rc<Cell<bool>>,
    log: &Log,
) -> FdHandler<L> {
    let (p1, p2, p3) = (pending.clone(), pending.clone(), pending.clone());
    let (l1, l2, l3, l4) = (log.clone(), log.clone(), log.clone(), log.clone());
    let late = late.clone();
    FdHandler::new()
        .on_read(move |_| l1.borrow_mut().push("read"))
        .on_poll(move || p1.get())
        .on_poll_ready(move |_| {
            p2.set(false);
            l2.borrow_mut().push("ready");
        })
        .on_poll_begin(move || l3.borrow_mut().push("begin"))
        .on_poll_end(move || {
            l4.borrow_mut().push("end");
            if late.replace(false) {
                p3.set(true);
            }
        })
}
