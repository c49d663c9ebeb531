//! Unit tests of the loop's policy under a fake clock and a scripted monitor.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use super::shared::CONTEXT_NOTIFIER;
use super::*;
use crate::clock::FakeClock;
use crate::polling::{PollParams, PollRule, DEFAULT_POLL_MAX_NS, POLL_START_NS};
use crate::FdHandler;
use aio_core::{Event, Token};

/// Something the scripted monitor runs inside a wait.
pub(super) type WaitAction = Box<dyn FnOnce()>;

/// A monitor whose waits advance a fake clock by scripted amounts and report injected fds
/// (readable; writable too when in `inject_writable`), or fail with scripted errors first.
/// It records each wait's timeout and each fd's interest, runs a scripted action inside a
/// wait (where the loop is blocked), and fails deregistrations with scripted errnos.
#[derive(Default, Clone)]
pub(super) struct Script {
    pub(super) clock: FakeClock,
    pub(super) blocks: Rc<RefCell<VecDeque<u64>>>,
    pub(super) inject: Rc<RefCell<Vec<RawFd>>>,
    pub(super) inject_writable: Rc<RefCell<Vec<RawFd>>>,
    pub(super) errors: Rc<RefCell<VecDeque<io::ErrorKind>>>,
    /// Run at the start of the next wait, one per wait.
    pub(super) during_wait: Rc<RefCell<VecDeque<WaitAction>>>,
    /// Every wait's timeout, in order.
    pub(super) timeouts: Rc<RefCell<Vec<Option<Duration>>>>,
    /// The interest each fd was last registered or modified with.
    pub(super) interests: Rc<RefCell<HashMap<RawFd, Interest>>>,
    /// Errnos the next deregistrations fail with.
    pub(super) deregister_errors: Rc<RefCell<VecDeque<i32>>>,
    tokens: Rc<RefCell<HashMap<RawFd, Token>>>,
}

impl EventLoop for Script {
    fn name(&self) -> &'static str {
        "script"
    }
    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        self.modify(fd, token, interest)
    }
    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        self.tokens.borrow_mut().insert(fd.as_raw_fd(), token);
        self.interests.borrow_mut().insert(fd.as_raw_fd(), interest);
        Ok(())
    }
    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if let Some(errno) = self.deregister_errors.borrow_mut().pop_front() {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.forget_closed(fd.as_raw_fd())
    }
    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()> {
        self.tokens.borrow_mut().remove(&fd);
        Ok(())
    }
    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        self.timeouts.borrow_mut().push(timeout);
        let action = self.during_wait.borrow_mut().pop_front();
        if let Some(action) = action {
            action();
        }
        if let Some(kind) = self.errors.borrow_mut().pop_front() {
            return Err(io::Error::from(kind));
        }
        if timeout != Some(Duration::ZERO) {
            let ns = self.blocks.borrow_mut().pop_front().unwrap_or(0);
            self.clock.advance(ns);
        }
        let writable: Vec<RawFd> = self.inject_writable.borrow_mut().drain(..).collect();
        for fd in self.inject.borrow_mut().drain(..) {
            if let Some(&token) = self.tokens.borrow().get(&fd) {
                events.push(Event {
                    token,
                    readable: true,
                    writable: writable.contains(&fd),
                    invalid: false,
                });
            }
        }
        Ok(())
    }
    fn registered(&self) -> usize {
        self.tokens.borrow().len()
    }
}

/// Sets its flag when dropped: whether what captured it is gone.
pub(super) struct DropFlag(pub(super) Rc<Cell<bool>>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.set(true);
    }
}

pub(super) fn scripted() -> (AioContext<Script>, Script) {
    let script = Script {
        clock: FakeClock::new(1_000_000),
        ..Script::default()
    };
    script.clock.set_step(10);
    let ctx = AioContext::with_clock(script.clone(), Box::new(script.clock.clone())).unwrap();
    (ctx, script)
}

/// An `io_poll` handler that says "ready" on the n-th check after its countdown is set to n
/// (0: never); returns its notifier (keep it alive) and the countdown.
pub(super) fn countdown_handler(ctx: &AioContext<Script>) -> (Notifier, Rc<Cell<u32>>) {
    let doorbell = Notifier::new().unwrap();
    let countdown = Rc::new(Cell::new(0u32));
    let c = countdown.clone();
    ctx.set_fd_handler(
        &doorbell,
        FdHandler::new()
            .on_poll(move || match c.get() {
                0 => false,
                1 => {
                    c.set(0);
                    true
                }
                n => {
                    c.set(n - 1);
                    false
                }
            })
            .on_poll_ready(|_| {}),
    )
    .unwrap();
    (doorbell, countdown)
}

#[test]
fn adaptive_window_grows_keeps_and_shrinks_with_a_fake_clock() {
    let (ctx, script) = scripted();
    // QEMU's rule, each wait judged alone.
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    assert_eq!(
        ctx.counters().poll_ns,
        POLL_START_NS,
        "polling starts at 4 us"
    );
    let (_doorbell, countdown) = countdown_handler(&ctx);
    // Blocked a little longer than the window (polling found nothing): grow x2.
    script.blocks.borrow_mut().push_back(2_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, 8_000);
    script.blocks.borrow_mut().push_back(2_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, 16_000);
    // Polling found the event inside the window: keep.
    countdown.set(3);
    assert!(ctx.poll(true));
    assert_eq!(ctx.counters().poll_ns, 16_000);
    assert_eq!(ctx.counters().poll_hits, 1);
    // Blocked for 1 ms, beyond poll_max_ns: shrink (0 = reset to 0).
    script.blocks.borrow_mut().push_back(1_000_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, 0);
    // From 0 it starts again at 4 us; shrink by a divisor when one is set.
    script.blocks.borrow_mut().push_back(2_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, POLL_START_NS);
    ctx.set_poll_params(PollParams {
        max_ns: DEFAULT_POLL_MAX_NS,
        grow: 4,
        shrink: 2,
        rule: PollRule::Qemu,
        wake_ns: 0,
    });
    script.blocks.borrow_mut().push_back(2_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, 16_000, "grow x4");
    script.blocks.borrow_mut().push_back(5_000_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, 8_000, "shrink /2");
    let busy = ctx.counters().busy_poll_ns;
    assert!(busy > 0 && ctx.counters().poll_attempts >= 6);
}

#[test]
fn a_collapsed_window_is_probed_back_by_the_default_rule() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread());
    let (_doorbell, countdown) = countdown_handler(&ctx);
    // One wait beyond the max is forgiven, the second in a row collapses the window.
    script.blocks.borrow_mut().push_back(1_000_000);
    ctx.poll(true);
    assert_eq!(
        ctx.counters().poll_ns,
        POLL_START_NS,
        "one late event forgiven"
    );
    script.blocks.borrow_mut().push_back(1_000_000);
    ctx.poll(true);
    assert_eq!(ctx.counters().poll_ns, 0);
    assert_eq!(ctx.counters().poll_shrinks, 1);
    // Collapsed: waits that sleep past the max leave it at 0 (QEMU's rule would stay there)...
    let attempts = ctx.counters().poll_attempts;
    for _ in 0..4 {
        script.blocks.borrow_mut().push_back(1_000_000);
        ctx.poll(true);
    }
    assert_eq!(
        ctx.counters().poll_attempts,
        attempts,
        "no polling while collapsed"
    );
    assert_eq!(ctx.counters().poll_ns, 0);
    // ...until the probe: one window of poll_max_ns, which finds the event and restores it.
    countdown.set(3);
    assert!(ctx.poll(true));
    let k = ctx.counters();
    assert_eq!((k.poll_probes, k.poll_probe_hits), (1, 1));
    assert_eq!(k.poll_ns, DEFAULT_POLL_MAX_NS);
    assert_eq!(k.poll_attempts, attempts + 1);
}

#[test]
fn idle_bottom_halves_cap_the_wait_at_10_ms_and_urgent_ones_do_not_wait() {
    let (ctx, script) = scripted();
    let runs = Rc::new(Cell::new(0));
    let r = runs.clone();
    let bh = ctx.bh_new(move |_| r.set(r.get() + 1));
    assert_eq!(ctx.compute_timeout(), None, "nothing pending");
    assert!(bh.schedule_idle());
    assert_eq!(
        ctx.compute_timeout(),
        Some(IDLE_BH_DELAY_NS),
        "idle: wait, at most 10 ms"
    );
    // A timer due sooner still shortens the wait; one due later does not lengthen it.
    let t = ctx.timer_new(|_| {});
    ctx.timer_mod(t, ctx.now_ns() + 1_000_000).unwrap();
    assert!(ctx.compute_timeout().unwrap() <= 1_000_000);
    ctx.timer_mod(t, ctx.now_ns() + 50_000_000).unwrap();
    assert_eq!(ctx.compute_timeout(), Some(IDLE_BH_DELAY_NS));
    // The blocking iteration waited (not a zero-timeout wait) and ran the bottom half.
    let before = ctx.counters();
    script.blocks.borrow_mut().push_back(IDLE_BH_DELAY_NS);
    assert!(ctx.poll(true));
    assert_eq!(runs.get(), 1);
    assert_eq!(ctx.counters().blocking_waits, before.blocking_waits + 1);
    // Scheduled idle, then urgent: no wait.
    assert!(bh.schedule_idle());
    assert!(bh.schedule());
    assert_eq!(ctx.compute_timeout(), Some(0), "urgent overrides idle");
    assert!(ctx.poll(true));
    assert_eq!(runs.get(), 2, "ran once for the two schedules");
    assert!(!ctx.poll(false), "the stale entry runs nothing");
    assert_eq!(runs.get(), 2);
    // Urgent, then idle: stays urgent.
    assert!(bh.schedule());
    assert!(bh.schedule_idle());
    assert_eq!(ctx.compute_timeout(), Some(0));
    ctx.timer_free(t).unwrap();
}

#[test]
fn idle_handlers_leave_the_poll_set_and_return_on_activity() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread());
    ctx.set_poll_idle_interval(Duration::from_secs(7));
    let fds: Vec<Notifier> = (0..3).map(|_| Notifier::new().unwrap()).collect();
    for n in &fds {
        ctx.set_fd_handler(n, FdHandler::new().on_read(|_| {}).on_poll(|| false))
            .unwrap();
    }
    assert_eq!(ctx.counters().poll_set, 3);
    // 8 s pass with nothing happening.
    script.blocks.borrow_mut().push_back(8_000_000_000);
    ctx.poll(true);
    // The next polling window drops all three.
    script.blocks.borrow_mut().push_back(2_000);
    ctx.poll(true);
    let c = ctx.counters();
    assert_eq!(
        (c.poll_set, c.poll_idle_removals, c.unpolled_handlers),
        (0, 3, 3)
    );
    // An fd event on one of them brings it back.
    script.inject.borrow_mut().push(fds[1].as_raw_fd());
    assert!(ctx.poll(true));
    assert_eq!(ctx.counters().poll_set, 1);
}

#[test]
fn wait_timeout_rule() {
    let (ctx, script) = scripted();
    assert_eq!(ctx.compute_timeout(), None, "nothing pending: infinite");
    let t = ctx.timer_new(|_| {});
    let now = script.clock.now_ns();
    ctx.timer_mod(t, now + 5_000).unwrap();
    let timeout = ctx.compute_timeout().unwrap();
    assert!(
        timeout <= 5_000 && timeout > 4_000,
        "up to the earliest deadline: {timeout}"
    );
    let bh = ctx.bh_new(|_| {});
    bh.schedule();
    assert_eq!(ctx.compute_timeout(), Some(0), "a pending BH: 0");
    bh.cancel();
    ctx.poll(false);
    assert_ne!(ctx.compute_timeout(), Some(0));
}

#[test]
fn timer_with_fake_clock_never_fires_early() {
    let (ctx, script) = scripted();
    script.clock.set_step(0);
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    let t = ctx.timer_new(move |_| f.set(true));
    let deadline = script.clock.now_ns() + 1_000;
    ctx.timer_mod(t, deadline).unwrap();
    script.clock.advance(999);
    assert!(!ctx.poll(false));
    assert!(!fired.get());
    script.clock.advance(1);
    assert!(ctx.poll(false));
    assert!(fired.get());
}

#[test]
fn timer_rearmed_in_the_past_runs_once_per_iteration() {
    let (ctx, _script) = scripted();
    let runs = Rc::new(Cell::new(0u32));
    let r = runs.clone();
    let id = Rc::new(Cell::new(None));
    let i = id.clone();
    let t = ctx.timer_new(move |ctx| {
        r.set(r.get() + 1);
        ctx.timer_mod(i.get().unwrap(), 0).unwrap();
    });
    id.set(Some(t));
    ctx.timer_mod(t, 0).unwrap();
    assert!(ctx.poll(false));
    assert_eq!(
        runs.get(),
        1,
        "re-armed in the past: next iteration, not a loop"
    );
    assert!(ctx.poll(false));
    assert_eq!(runs.get(), 2);
    ctx.timer_free(t).unwrap();
    assert!(!ctx.poll(false));
}

#[test]
fn io_poll_without_poll_ready_falls_back_to_io_read() {
    let (ctx, _script) = scripted();
    ctx.set_poll_params(PollParams::iothread());
    let doorbell = Notifier::new().unwrap();
    let pending = Rc::new(Cell::new(true));
    let reads = Rc::new(Cell::new(0u32));
    let (p, p2, r) = (pending.clone(), pending.clone(), reads.clone());
    ctx.set_fd_handler(
        &doorbell,
        FdHandler::new().on_poll(move || p.get()).on_read(move |_| {
            p2.set(false);
            r.set(r.get() + 1);
        }),
    )
    .unwrap();
    assert!(ctx.poll(true));
    assert_eq!(reads.get(), 1);
    assert!(!pending.get());
}

#[test]
fn a_late_notifier_write_is_cleared_by_its_event() {
    let (ctx, script) = scripted();
    // A notify() that saw notify_me just before the loop dropped it writes after the loop
    // accepted `notified`: the eventfd is readable with `notified` false.
    ctx.shared.notifier.notify().unwrap();
    script
        .inject
        .borrow_mut()
        .push(ctx.shared.notifier.as_raw_fd());
    script
        .tokens
        .borrow_mut()
        .insert(ctx.shared.notifier.as_raw_fd(), CONTEXT_NOTIFIER);
    assert!(
        !ctx.poll(false),
        "the context's own notifier is not progress"
    );
    assert!(
        !ctx.shared.notifier.test_and_clear(),
        "the event cleared the notifier, so later waits can block"
    );
}

#[test]
fn a_running_timer_does_not_block_other_timers_in_a_nested_poll() {
    let (ctx, script) = scripted();
    script.clock.set_step(0);
    let b_ran = Rc::new(Cell::new(false));
    let b = b_ran.clone();
    let timer_b = ctx.timer_new(move |_| b.set(true));
    let seen = Rc::new(Cell::new(false));
    let s = seen.clone();
    let clock = script.clock.clone();
    let timer_a = ctx.timer_new(move |ctx| {
        clock.advance(10);
        ctx.poll(false);
        s.set(ctx.counters().timer_runs == 2);
    });
    let now = ctx.now_ns();
    ctx.timer_mod(timer_a, now).unwrap();
    ctx.timer_mod(timer_b, now + 5).unwrap();
    assert!(ctx.poll(false));
    assert!(b_ran.get());
    assert!(seen.get(), "timer b ran inside a's nested poll");
}

#[test]
fn merged_counters_add_counts_and_keep_the_larger_gauges() {
    let a = LoopCounters {
        iterations: 3,
        bh_runs: 1,
        poll_ns: 4_000,
        poll_set: 2,
        max_nesting: 1,
        ..LoopCounters::default()
    };
    let b = LoopCounters {
        iterations: 5,
        timer_runs: 7,
        poll_ns: 1_000,
        poll_set: 3,
        max_nesting: 2,
        ..LoopCounters::default()
    };
    let mut m = a;
    m.merge(&b);
    assert_eq!((m.iterations, m.bh_runs, m.timer_runs), (8, 1, 7));
    assert_eq!((m.poll_ns, m.poll_set, m.max_nesting), (4_000, 5, 2));
}

#[test]
fn a_deferred_call_runs_at_once_outside_a_section_and_once_at_the_outermost_end() {
    let ctx = AioContext::new(Script::default()).unwrap();
    let log: Rc<RefCell<Vec<&str>>> = Rc::default();
    let (l1, l2) = (log.clone(), log.clone());
    let irq = ctx.deferred_call(move || l1.borrow_mut().push("irq"));
    let doorbell = ctx.deferred_call(move || l2.borrow_mut().push("doorbell"));
    irq.call();
    assert_eq!(*log.borrow(), ["irq"], "outside a section: at once");
    log.borrow_mut().clear();
    let outer = ctx.defer_section();
    doorbell.call();
    irq.call();
    {
        let _inner = ctx.defer_section();
        irq.call();
        doorbell.call();
    }
    assert!(log.borrow().is_empty(), "the inner end runs nothing");
    assert!(irq.is_pending() && doorbell.is_pending());
    drop(outer);
    assert_eq!(
        *log.borrow(),
        ["doorbell", "irq"],
        "once each, in first-call order"
    );
    assert!(!irq.is_pending());
}

#[test]
fn a_call_made_while_deferred_calls_run_joins_the_pass_and_a_panic_closes_the_section() {
    let ctx = AioContext::new(Script::default()).unwrap();
    let log: Rc<RefCell<Vec<&str>>> = Rc::default();
    let l = log.clone();
    let second = ctx.deferred_call(move || l.borrow_mut().push("second"));
    let l = log.clone();
    let first = ctx.deferred_call(move || {
        l.borrow_mut().push("first");
        second.call();
    });
    let section = ctx.defer_section();
    first.call();
    drop(section);
    assert_eq!(*log.borrow(), ["first", "second"]);
    // A panicking call leaves no section open behind it.
    let boom = ctx.deferred_call(|| panic!("deferred call panics"));
    let section = ctx.defer_section();
    boom.call();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(section)));
    assert!(unwound.is_err());
    log.borrow_mut().clear();
    first.call();
    assert_eq!(
        *log.borrow(),
        ["first", "second"],
        "outside a section again"
    );
}

#[test]
fn auto_polling_turns_off_for_long_waits_and_says_why() {
    let (ctx, script) = scripted();
    let (_doorbell, _countdown) = countdown_handler(&ctx);
    ctx.set_poll_params(PollParams::auto().with_wake_ns(30_000));
    // Nothing for the checks to find; each wait blocks 500 µs. After the first 16 waits polling
    // is off, and only probes poll: the 4th wait after, then each missing probe doubles the
    // gap to the next (4, 8, 16, 32, then 64 waits).
    for _ in 0..16 + 4 + 8 + 16 + 32 + 64 + 64 {
        script.blocks.borrow_mut().push_back(500_000);
        ctx.poll(true);
    }
    let c = ctx.counters();
    assert_eq!(c.poll_wake_ns, 30_000, "the wake-up cost given");
    assert_eq!(
        c.poll_auto_choices, 1,
        "the first after 16 waits; 6 probes make no other"
    );
    assert_eq!(c.poll_auto_off, 1, "off: {c:?}");
    assert_eq!(c.poll_ns, 0);
    // 16 waits at the start window (4 µs), then 6 probes of twice the wake-up (60 µs).
    assert_eq!(c.poll_attempts, 22, "{c:?}");
    assert!(c.busy_poll_missed_ns <= 16 * 4_100 + 6 * 60_100, "{c:?}");
    assert_eq!(c.poll_hits, 0);
}

#[test]
fn auto_polling_keeps_a_window_that_catches_short_waits() {
    let (ctx, script) = scripted();
    let (_doorbell, countdown) = countdown_handler(&ctx);
    ctx.set_poll_params(PollParams::auto().with_wake_ns(30_000));
    for _ in 0..64 {
        // Ready after 100 checks: 1 µs of the fake clock.
        countdown.set(100);
        script.blocks.borrow_mut().push_back(0);
        ctx.poll(true);
    }
    let c = ctx.counters();
    assert_eq!(c.poll_auto_choices, 4);
    assert_eq!(c.poll_auto_off, 0, "{c:?}");
    assert!(c.poll_ns >= 1_000, "a window that covers the waits: {c:?}");
    assert_eq!(c.busy_poll_ns, 64 * 1_000);
    assert_eq!(c.poll_hits, 64);
    // Back to a fixed window: the model is gone and its counters with it.
    ctx.set_poll_params(PollParams::iothread());
    assert_eq!(ctx.counters().poll_auto_choices, 0);
}
