//! Unit tests of what wakes the loop and how long it waits, on the scripted monitor and fake
//! clock of `tests.rs`: bottom halves scheduled from the loop's thread and from others,
//! blocked or not (the notify_me handshake through the context's counters), notifications
//! and their handles, timer ids, and a running timer re-armed in the past that must not make
//! its own nested poll's wait zero.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use super::tests::scripted;
use super::*;

/// `(notify_calls, notifier_writes)`.
fn notifications(ctx: &AioContext<super::tests::Script>) -> (u64, u64) {
    let c = ctx.counters();
    (c.notify_calls, c.notifier_writes)
}

#[test]
fn a_bottom_half_from_the_loops_thread_needs_no_notification() {
    let (ctx, _script) = scripted();
    let bh = ctx.bh_new(|_| {});
    let idle = ctx.bh_new(|_| {});
    let before = notifications(&ctx);
    bh.schedule();
    idle.schedule_idle();
    assert_eq!(notifications(&ctx), before, "the loop sees its own queue");
    ctx.poll(false);
}

#[test]
fn another_threads_idle_bottom_half_wakes_only_a_blocked_loop() {
    let (ctx, script) = scripted();
    let early = ctx.bh_new(|_| {});
    let (calls, writes) = notifications(&ctx);
    std::thread::scope(|s| {
        s.spawn(|| early.schedule_idle());
    });
    assert_eq!(
        notifications(&ctx),
        (calls + 1, writes),
        "a loop that is not blocked finds it when it computes its timeout"
    );
    assert!(ctx.poll(false), "it runs");
    // Scheduled while the loop waits (the monitor's wait runs the schedule): the loop is
    // blocked, so the notifier is written.
    let late = ctx.bh_new(|_| {});
    let from_wait = late.clone();
    script.during_wait.borrow_mut().push_back(Box::new(move || {
        std::thread::scope(|s| {
            s.spawn(|| from_wait.schedule_idle());
        });
    }));
    ctx.poll(true);
    assert_eq!(notifications(&ctx), (calls + 2, writes + 1));
}

#[test]
fn a_notification_is_counted_and_written_only_for_a_blocked_loop() {
    let (ctx, script) = scripted();
    let handle = ctx.notify_handle();
    assert!(format!("{handle:?}").contains("NotifyHandle"));
    let (calls, writes) = notifications(&ctx);
    ctx.notify();
    assert_eq!(
        notifications(&ctx),
        (calls + 1, writes),
        "not blocked: no write"
    );
    ctx.poll(false);
    script
        .during_wait
        .borrow_mut()
        .push_back(Box::new(move || handle.notify()));
    ctx.poll(true);
    assert_eq!(
        notifications(&ctx),
        (calls + 2, writes + 1),
        "blocked: written"
    );
}

#[test]
fn timers_have_their_own_ids() {
    let (ctx, _script) = scripted();
    let a = ctx.timer_new(|_| {});
    let b = ctx.timer_new(|_| {});
    assert_ne!(a.as_u64(), b.as_u64());
    assert_ne!(a, b);
}

#[test]
fn a_running_timer_rearmed_in_the_past_does_not_make_its_nested_wait_zero() {
    let (ctx, script) = scripted();
    let id = Rc::new(Cell::new(None));
    let nested_timeout = Rc::new(RefCell::new(None));
    let (me, seen, timeouts) = (id.clone(), nested_timeout.clone(), script.timeouts.clone());
    let t = ctx.timer_new(move |ctx| {
        if seen.borrow().is_some() {
            return;
        }
        // Due again at once, but it cannot run while this call runs: the nested blocking
        // poll waits as if it were not armed (nothing else is, so without a limit).
        ctx.timer_mod(me.get().unwrap(), 0).unwrap();
        ctx.poll(true);
        *seen.borrow_mut() = Some(timeouts.borrow().last().copied().flatten());
    });
    id.set(Some(t));
    ctx.timer_mod(t, 0).unwrap();
    assert!(ctx.poll(false));
    let timeout = nested_timeout.borrow().expect("the nested poll waited");
    assert_ne!(timeout, Some(Duration::ZERO), "{timeout:?}");
}
