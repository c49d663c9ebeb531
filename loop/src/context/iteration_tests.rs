//! Unit tests of one iteration's steps and of the poll set, on the scripted monitor and fake
//! clock of `tests.rs`: the wait's retries and errors, the nesting depth, a wait skipped when
//! polling found the work, dispatch's deduplication and directions, the poll set's membership
//! and idle interval, polling mode for a handler that leaves the set, which iterations teach
//! the polling window, and when the automatic window's model is kept; and the context's own
//! items (its monitor's name, `is_polling`, an idle bottom half scheduled twice, the tasks it
//! runs and drops).

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Duration;

use super::tests::{countdown_handler, scripted, DropFlag};
use super::*;
use crate::polling::{PollParams, PollRule};
use crate::FdHandler;

#[test]
fn an_interrupted_wait_is_retried_and_counted_and_another_error_fails_the_poll() {
    let (ctx, script) = scripted();
    let doorbell = Notifier::new().unwrap();
    ctx.set_fd_handler(&doorbell, FdHandler::new().on_read(|_| {}))
        .unwrap();
    script
        .errors
        .borrow_mut()
        .extend([io::ErrorKind::Interrupted, io::ErrorKind::Interrupted]);
    script.inject.borrow_mut().push(doorbell.as_raw_fd());
    assert!(
        ctx.try_poll(true).unwrap(),
        "the retried wait delivered the event"
    );
    let c = ctx.counters();
    assert_eq!((c.wait_retries, c.wait_errors), (2, 0));
    assert_eq!(c.blocking_waits, 3, "three attempts");
    assert_eq!(c.handler_calls, 1);

    script
        .errors
        .borrow_mut()
        .push_back(io::ErrorKind::PermissionDenied);
    let e = ctx.try_poll(true).unwrap_err();
    assert!(
        matches!(
            e,
            AioError::Wait {
                monitor: "script",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(ctx.counters().wait_errors, 1);
    assert_eq!(ctx.counters().wait_retries, 2, "not retried");
}

#[test]
fn sequential_polls_do_not_nest_and_a_poll_inside_a_callback_does() {
    let (ctx, script) = scripted();
    ctx.poll(false);
    ctx.poll(false);
    assert_eq!(ctx.counters().max_nesting, 1);
    let bh = ctx.bh_new(|ctx| {
        ctx.poll(false);
    });
    bh.schedule();
    script.blocks.borrow_mut().push_back(0);
    ctx.poll(true);
    ctx.poll(false);
    assert_eq!(ctx.counters().max_nesting, 2);
}

/// Two pollable handlers; the first says "ready" on its third check.
fn two_pollers(ctx: &AioContext<super::tests::Script>) -> (Notifier, Notifier, Rc<Cell<u32>>) {
    let (first, countdown) = countdown_handler(ctx);
    let second = Notifier::new().unwrap();
    ctx.set_fd_handler(&second, FdHandler::new().on_read(|_| {}).on_poll(|| false))
        .unwrap();
    (first, second, countdown)
}

#[test]
fn work_found_by_polling_skips_the_wait_only_when_polling_covers_every_handler() {
    let (ctx, _script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let (_first, second, countdown) = two_pollers(&ctx);
    countdown.set(3);
    assert!(ctx.poll(true), "the handler polling found ran");
    let c = ctx.counters();
    assert_eq!((c.poll_hits, c.poll_attempts, c.waits_skipped), (1, 1, 1));
    assert_eq!((c.blocking_waits, c.nonblocking_waits), (0, 0));
    assert_eq!(c.handler_calls, 1);

    // A handler that waits for writability is the monitor's: the wait happens (not blocking).
    ctx.update_fd_handler(
        &second,
        FdHandler::new()
            .on_read(|_| {})
            .on_write(|_| {})
            .on_poll(|| false),
    )
    .unwrap();
    countdown.set(3);
    assert!(ctx.poll(true));
    let c = ctx.counters();
    assert_eq!((c.waits_skipped, c.nonblocking_waits), (1, 1));
}

/// A handler outside the poll set (here one without `io_poll`) is the monitor's: while
/// polling keeps finding work the wait is skipped, but never for longer than the bound after
/// the last wait, and then the handler's event is seen.
#[test]
fn polling_skips_the_wait_for_a_bounded_time_while_a_handler_is_outside_the_poll_set() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let (_polled, countdown) = countdown_handler(&ctx);
    let plain = Notifier::new().unwrap();
    let reads = Rc::new(Cell::new(0));
    let r = reads.clone();
    ctx.set_fd_handler(
        &plain,
        FdHandler::new().on_read(move |_| r.set(r.get() + 1)),
    )
    .unwrap();
    // The last wait was long ago (never): polling's work does not skip this one.
    countdown.set(1);
    assert!(ctx.poll(true));
    let c = ctx.counters();
    assert_eq!((c.waits_skipped, c.nonblocking_waits), (0, 1));
    // The plain fd is ready, but polling found work within the bound: no wait, not seen yet.
    script.inject.borrow_mut().push(plain.as_raw_fd());
    countdown.set(1);
    assert!(ctx.poll(true));
    assert_eq!(ctx.counters().waits_skipped, 1);
    assert_eq!(
        reads.get(),
        0,
        "outside the poll set, it waits for the monitor"
    );
    // Past the bound the wait happens even though polling found work, and the event runs.
    script.clock.advance(super::iteration::WAIT_SKIP_BOUND_NS);
    countdown.set(1);
    assert!(ctx.poll(true));
    let c = ctx.counters();
    assert_eq!((c.waits_skipped, c.nonblocking_waits), (1, 2));
    assert_eq!(reads.get(), 1);
}

#[test]
fn a_report_runs_its_handler_once_per_wait_and_only_in_its_direction() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let reads = Rc::new(Cell::new(0));
    let writes = Rc::new(Cell::new(0));
    let (r, w) = (reads.clone(), writes.clone());
    let ready = Rc::new(Cell::new(false));
    let is_ready = ready.clone();
    let fd = Notifier::new().unwrap();
    ctx.set_fd_handler(
        &fd,
        FdHandler::new()
            .on_read(move |_| r.set(r.get() + 1))
            .on_write(move |_| w.set(w.get() + 1))
            .on_poll(move || is_ready.get()),
    )
    .unwrap();
    // Polling finds it and the monitor reports it in the same iteration: one read call.
    ready.set(true);
    script.inject.borrow_mut().push(fd.as_raw_fd());
    assert!(ctx.poll(true));
    assert_eq!(
        (reads.get(), writes.get()),
        (1, 0),
        "readable only: no write call"
    );
    ready.set(false);
    // Readable and writable: each direction once.
    script.inject.borrow_mut().push(fd.as_raw_fd());
    script.inject_writable.borrow_mut().push(fd.as_raw_fd());
    assert!(ctx.poll(true));
    assert_eq!((reads.get(), writes.get()), (2, 1));
    assert_eq!(ctx.counters().handler_calls, 3);
}

#[test]
fn only_handlers_with_a_poll_check_join_the_poll_set_and_removal_leaves_it() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread());
    let plain = Notifier::new().unwrap();
    ctx.set_fd_handler(&plain, FdHandler::new().on_read(|_| {}))
        .unwrap();
    script.inject.borrow_mut().push(plain.as_raw_fd());
    assert!(ctx.poll(true));
    assert_eq!(ctx.counters().poll_set, 0, "no io_poll: never in the set");
    let (pollable, _countdown) = countdown_handler(&ctx);
    assert_eq!(ctx.counters().poll_set, 1);
    ctx.remove_fd_handler(&pollable).unwrap();
    assert_eq!(ctx.counters().poll_set, 0, "removed: out of the set");
}

#[test]
fn the_idle_interval_is_the_one_set() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    ctx.set_poll_idle_interval(Duration::from_millis(1));
    let (_fd, _countdown) = countdown_handler(&ctx);
    // Half the interval: still in the set.
    script.blocks.borrow_mut().push_back(500_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_set, 1);
    // Past it (far short of the default 7 s): out at the next polling iteration.
    script.blocks.borrow_mut().push_back(600_000);
    ctx.poll(true);
    script.blocks.borrow_mut().push_back(2_000);
    ctx.poll(true);
    let c = ctx.counters();
    assert_eq!((c.poll_set, c.poll_idle_removals), (0, 1));
}

#[test]
fn a_hooked_handler_that_goes_idle_while_polling_ends_its_polling_mode() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    ctx.set_poll_idle_interval(Duration::from_millis(1));
    let begins = Rc::new(Cell::new(0));
    let ends = Rc::new(Cell::new(0));
    let (b, e) = (begins.clone(), ends.clone());
    let quiet = Notifier::new().unwrap();
    ctx.set_fd_handler(
        &quiet,
        FdHandler::new()
            .on_read(|_| {})
            .on_poll(|| false)
            .on_poll_begin(move || b.set(b.get() + 1))
            .on_poll_end(move || e.set(e.get() + 1)),
    )
    .unwrap();
    // A second handler keeps polling on (its activity keeps it in the set).
    let (busy, countdown) = countdown_handler(&ctx);
    countdown.set(2);
    assert!(ctx.poll(true));
    assert_eq!(begins.get(), 1, "polling mode began");
    // 2 ms later the quiet one is idle; the busy one was just active again.
    script.clock.advance(2_000_000);
    script.inject.borrow_mut().push(busy.as_raw_fd());
    countdown.set(2);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_set, 1);
    countdown.set(2);
    ctx.poll(true);
    assert_eq!(ends.get(), 1, "left the set: polling mode ended");
}

#[test]
fn a_handler_whose_last_check_on_leaving_finds_work_stays_polled_and_is_served() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    ctx.set_poll_idle_interval(Duration::from_millis(1));
    let (begins, ends, served) = (
        Rc::new(Cell::new(0)),
        Rc::new(Cell::new(0)),
        Rc::new(Cell::new(0)),
    );
    // Work that arrives with no kick: only an io_poll check sees it.
    let work = Rc::new(Cell::new(false));
    let (b, e, s, w1, w2) = (
        begins.clone(),
        ends.clone(),
        served.clone(),
        work.clone(),
        work.clone(),
    );
    let quiet = Notifier::new().unwrap();
    ctx.set_fd_handler(
        &quiet,
        FdHandler::new()
            .on_read(|_| {})
            .on_poll(move || w1.get())
            .on_poll_ready(move |_| {
                w2.set(false);
                s.set(s.get() + 1);
            })
            .on_poll_begin(move || b.set(b.get() + 1))
            .on_poll_end(move || e.set(e.get() + 1)),
    )
    .unwrap();
    let (busy, countdown) = countdown_handler(&ctx);
    countdown.set(2);
    assert!(ctx.poll(true));
    assert_eq!(begins.get(), 1, "polling mode began");
    // Past the idle interval, with work waiting that only a check can see: the quiet handler
    // is due to leave, its last check finds the work, and it stays, polling mode on again.
    script.clock.advance(2_000_000);
    work.set(true);
    script.inject.borrow_mut().push(busy.as_raw_fd());
    countdown.set(2);
    ctx.poll(true);
    assert_eq!(
        (ends.get(), begins.get()),
        (1, 2),
        "ended, checked, began again"
    );
    assert_eq!(ctx.counters().poll_set, 2, "both in the set");
    assert_eq!(served.get(), 1, "the work was served by polling");
}

/// `n` iterations that block 2 µs each (the automatic window chooses every 16 waits).
fn blocking_polls(ctx: &AioContext<super::tests::Script>, script: &super::tests::Script, n: usize) {
    for _ in 0..n {
        script.blocks.borrow_mut().push_back(2_000);
        ctx.poll(true);
    }
}

#[test]
fn only_an_iteration_that_could_block_teaches_the_polling_window() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let (_fd, _countdown) = countdown_handler(&ctx);
    let start = ctx.counters().poll_ns;
    for _ in 0..5 {
        ctx.poll(false);
    }
    let bh = ctx.bh_new(|_| {});
    bh.schedule();
    ctx.poll(true);
    let c = ctx.counters();
    assert_eq!(c.poll_ns, start, "non-blocking iterations leave the window");
    assert_eq!(c.poll_attempts, 0, "and do not poll");
    // A blocking one that found nothing grows it.
    blocking_polls(&ctx, &script, 1);
    assert_eq!(ctx.counters().poll_ns, 2 * start);

    // The automatic window: non-blocking iterations are no waits to learn from.
    ctx.set_poll_params(PollParams::auto().with_wake_ns(30_000));
    for _ in 0..40 {
        ctx.poll(false);
    }
    assert_eq!(ctx.counters().poll_auto_choices, 0);
    blocking_polls(&ctx, &script, 16);
    assert_eq!(ctx.counters().poll_auto_choices, 1);
}

#[test]
fn the_automatic_window_needs_a_limit_and_keeps_what_it_learned_for_the_same_wake_up_cost() {
    let (ctx, script) = scripted();
    let (_fd, _countdown) = countdown_handler(&ctx);
    // Auto with a limit of 0 is polling off: no model, no choices.
    ctx.set_poll_params(PollParams::auto().with_wake_ns(30_000).with_max_ns(0));
    blocking_polls(&ctx, &script, 16);
    assert_eq!(ctx.counters().poll_auto_choices, 0);
    // A limit of 1 ns is a limit.
    ctx.set_poll_params(PollParams::auto().with_wake_ns(30_000).with_max_ns(1));
    blocking_polls(&ctx, &script, 16);
    assert_eq!(ctx.counters().poll_auto_choices, 1);
    // The same wake-up cost again: the model (its count of choices) goes on.
    let auto = PollParams::auto().with_wake_ns(30_000);
    ctx.set_poll_params(auto);
    // (After an off choice the probes that miss come ever further apart, at last one in 64
    // waits: 1000 waits make 18 of them, and 16 learned waits make a choice.)
    blocking_polls(&ctx, &script, 1_000);
    let learned = ctx.counters().poll_auto_choices;
    assert!(learned >= 2, "{learned}");
    ctx.set_poll_params(auto);
    assert_eq!(ctx.counters().poll_auto_choices, learned, "kept");
    // Another wake-up cost starts it afresh.
    ctx.set_poll_params(auto.with_wake_ns(40_000));
    assert_eq!(ctx.counters().poll_auto_choices, 0, "a new model");
}

#[test]
fn the_context_names_its_monitor_and_knows_when_it_is_polling() {
    let (ctx, _script) = scripted();
    assert_eq!(ctx.monitor_name(), "script");
    assert!(ctx.describe_monitor().contains("script"));
    let debug = format!("{ctx:?}");
    assert!(
        debug.contains("AioContext") && debug.contains("script"),
        "{debug}"
    );
    assert!(!ctx.is_polling());
    let inside = Rc::new(Cell::new(false));
    let seen = inside.clone();
    let bh = ctx.bh_new(move |ctx| seen.set(ctx.is_polling()));
    bh.schedule();
    ctx.poll(false);
    assert!(inside.get(), "a callback runs inside poll()");
    assert!(!ctx.is_polling());
}

#[test]
fn an_idle_bottom_half_scheduled_twice_stays_idle() {
    let (ctx, _script) = scripted();
    let bh = ctx.bh_new(|_| {});
    assert!(bh.schedule_idle());
    assert!(bh.schedule_idle());
    let timeout = ctx.compute_timeout().unwrap();
    assert!(timeout > 0, "still idle: the wait is capped, not skipped");
}

#[test]
fn spawned_tasks_run_in_plain_polls_and_are_dropped_with_the_context() {
    let (ctx, _script) = scripted();
    let ran = Rc::new(Cell::new(false));
    let r = ran.clone();
    let _done = ctx.spawn(async move { r.set(true) });
    for _ in 0..3 {
        ctx.poll(false);
    }
    assert!(
        ran.get(),
        "a spawned task runs in the loop's own iterations"
    );
    // A task that never finishes is dropped with the context, and bottom halves held
    // elsewhere stop scheduling.
    let dropped = Rc::new(Cell::new(false));
    let guard = DropFlag(dropped.clone());
    let _pending = ctx.spawn(async move {
        let _guard = guard;
        std::future::pending::<()>().await
    });
    ctx.poll(false);
    let bh = ctx.bh_new(|_| {});
    drop(ctx);
    assert!(dropped.get(), "the unfinished task's future was dropped");
    assert!(!bh.schedule(), "a deleted bottom half refuses schedules");
}

#[test]
fn a_task_woken_by_a_handler_runs_before_its_poll_returns() {
    use std::future::poll_fn;
    use std::task::{Poll, Waker};
    let (ctx, script) = scripted();
    let waker: Rc<RefCell<Option<Waker>>> = Rc::default();
    let done = Rc::new(Cell::new(false));
    let (w, d) = (waker.clone(), done.clone());
    let _task = ctx.spawn(poll_fn(move |cx| {
        if w.borrow_mut().replace(cx.waker().clone()).is_some() {
            d.set(true);
            return Poll::Ready(());
        }
        Poll::Pending
    }));
    ctx.poll(false);
    assert!(
        waker.borrow().is_some() && !done.get(),
        "first poll: pending"
    );
    let doorbell = Notifier::new().unwrap();
    let to_wake = waker.clone();
    ctx.set_fd_handler(
        &doorbell,
        FdHandler::new().on_read(move |_| {
            if let Some(w) = to_wake.borrow().as_ref() {
                w.wake_by_ref();
            }
        }),
    )
    .unwrap();
    script.inject.borrow_mut().push(doorbell.as_raw_fd());
    assert!(ctx.poll(true));
    assert!(
        done.get(),
        "the woken task ran at the end of the same iteration"
    );
}

#[test]
fn a_bottom_half_says_whether_it_is_scheduled() {
    let (ctx, _script) = scripted();
    let bh = ctx.bh_new(|_| {});
    assert!(!bh.is_scheduled());
    bh.schedule();
    assert!(bh.is_scheduled());
    ctx.poll(false);
    assert!(!bh.is_scheduled(), "it ran");
    bh.schedule_idle();
    assert!(bh.cancel() && !bh.is_scheduled(), "cancelled");
}

#[test]
fn a_cancelled_bottom_half_does_not_keep_the_loop_from_waiting() {
    let (ctx, _script) = scripted();
    let bh = ctx.bh_new(|_| {});
    bh.schedule();
    assert_eq!(ctx.compute_timeout(), Some(0));
    bh.cancel();
    assert_ne!(ctx.compute_timeout(), Some(0), "its queue entry is stale");
}

#[test]
fn bottom_halves_have_their_own_ids_and_say_so_in_debug() {
    let (ctx, _script) = scripted();
    let (a, b) = (ctx.bh_new(|_| {}), ctx.bh_new(|_| {}));
    assert_ne!(a.id(), b.id());
    let debug = format!("{a:?}");
    assert!(
        debug.contains("BottomHalf") && debug.contains(&a.id().to_string()),
        "{debug}"
    );
}

#[test]
fn a_bottom_half_is_deleted_once() {
    let (ctx, _script) = scripted();
    let bh = ctx.bh_new(|_| {});
    ctx.bh_delete(&bh).unwrap();
    let again = ctx.bh_delete(&bh);
    assert!(
        matches!(again, Err(AioError::UnknownBottomHalf { .. })),
        "{again:?}"
    );
    assert!(!bh.schedule());
}

#[test]
fn the_automatic_window_learns_a_wait_after_the_callbacks_it_woke() {
    // The model's arithmetic must not delay the next request: the callbacks of the wait run
    // first, and the wait is learned before poll() returns.
    let (ctx, script) = scripted();
    let doorbell = Notifier::new().unwrap();
    let countdown = Rc::new(Cell::new(0u32));
    let choices_seen = Rc::new(RefCell::new(Vec::new()));
    let (c, seen) = (countdown.clone(), choices_seen.clone());
    ctx.set_fd_handler(
        &doorbell,
        FdHandler::new()
            .on_poll(move || {
                c.set(c.get().saturating_sub(1));
                c.get() == 0
            })
            .on_poll_ready(move |ctx| seen.borrow_mut().push(ctx.counters().poll_auto_choices)),
    )
    .unwrap();
    ctx.set_poll_params(PollParams::auto().with_wake_ns(30_000));
    for _ in 0..u64::from(crate::polling::auto::UPDATE_EVERY) {
        countdown.set(100);
        script.blocks.borrow_mut().push_back(0);
        ctx.poll(true);
    }
    // The 16th wait makes the first choice: after its callback, before poll() returned.
    assert_eq!(choices_seen.borrow().len(), 16, "every wait was caught");
    assert_eq!(choices_seen.borrow().last(), Some(&0));
    assert_eq!(ctx.counters().poll_auto_choices, 1);
}
