//! The engine suite's tests that run a loop: the engine attached to an [`AioContext`], its
//! notifier, per-request callbacks, nested `poll()`, injected faults and a context dropped
//! with requests in flight.
//!
//! This module owns those tests, never a fixture (see `fixtures`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::fixtures::{ok, read_block, submit_all, wait_readable, TempFile, BLOCK};
use aio_core::engine::{AlignedBuf, Completion, IoEngine, IoFile, Request, RequestError};
use aio_core::EventLoop;
use aio_loop::AioContext;

/// Each completion makes the notifier readable (no polling of the engine in between) and
/// `has_completions` true, over many rounds: a batch flag that goes stale would hang here.
pub fn notifier_signals_every_completion_batch<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(16 * BLOCK, 1);
    let file = tmp.open(0).unwrap();
    let mut out = VecDeque::new();
    for round in 0..500u64 {
        engine.submit(read_block(&file, round % 16, round)).unwrap();
        assert!(
            wait_readable(engine.notifier().as_raw_fd(), Duration::from_secs(30)),
            "round {round}: the notifier never became readable"
        );
        engine.notifier().test_and_clear();
        // The notifier may fire a moment before the completion is visible: wait for it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !engine.has_completions() {
            assert!(
                Instant::now() < deadline,
                "round {round}: signalled, nothing waiting"
            );
            std::thread::yield_now();
        }
        out.clear();
        while out.is_empty() {
            engine.poll_completions(&mut out);
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token, round);
        assert!(!engine.has_completions());
    }
}

/// 2000 sequential reads through an attached engine on a context with `params`, each one's
/// completion waited for in the loop before the next goes out; the loop's counters after.
fn qd1_reads<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: E,
    monitor: L,
    params: aio_loop::PollParams,
) -> aio_loop::LoopCounters {
    let ctx = AioContext::new(monitor).unwrap();
    ctx.set_poll_params(params);
    let tmp = TempFile::with_len(16 * BLOCK, 1);
    let file = tmp.open(0).unwrap();
    let back: Rc<RefCell<Option<Completion>>> = Rc::default();
    let b = back.clone();
    let attached = ctx
        .attach_engine(engine, move |_, c| *b.borrow_mut() = Some(c))
        .unwrap();
    let mut buf = Some(AlignedBuf::new(BLOCK));
    for i in 0..2000u64 {
        attached
            .submit(Request::read(
                &file,
                (i % 16) * BLOCK as u64,
                buf.take().unwrap(),
                i,
            ))
            .unwrap();
        super::poll_until(&ctx, "the next completion", || back.borrow().is_some());
        let c = back.borrow_mut().take().unwrap();
        assert_eq!(c.token, i);
        assert_eq!(ok(&c), BLOCK);
        buf = c.buf.into_one();
    }
    ctx.counters()
}

/// Thousands of sequential requests through an attached engine with polling off: every one
/// must be woken by the notifier alone.
pub fn qd1_through_the_loop_without_polling<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let c = qd1_reads(engine(), monitor(), aio_loop::PollParams::default());
    assert_eq!(c.poll_hits, 0, "polling is off");
}

/// Thousands of sequential requests through an attached engine with the automatic window
/// ([`PollRule::Auto`](aio_loop::PollRule::Auto)), a wake-up priced far above any wait and the
/// window allowed up to the histogram's last bucket: the model keeps choosing, never turns
/// polling off, and polling catches completions.
///
/// Nothing here depends on the machine's speed: at that price one wait in a few thousand
/// caught within ~3.4 ms makes polling pay, and a thread-pool worker that needs milliseconds
/// to be scheduled on a loaded machine still lands inside the window most of the time; the
/// test asks for a twentieth of the requests caught by polling, not for a latency.
pub fn qd1_with_the_automatic_window_polls_for_the_completions<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let auto = aio_loop::PollParams::auto()
        .with_max_ns(AUTO_TEST_MAX_NS)
        .with_wake_ns(AUTO_TEST_WAKE_NS);
    let c = qd1_reads(engine(), monitor(), auto);
    // 2000 waits at least, a choice every 16.
    assert!(c.poll_auto_choices >= 100, "{c:?}");
    assert_eq!(c.poll_auto_off, 0, "{c:?}");
    assert_eq!(c.poll_wake_ns, AUTO_TEST_WAKE_NS);
    assert!(c.poll_hits >= 100, "polling caught completions: {c:?}");
}

/// The window cap the automatic-window tests give: past the histogram's last bucket (about
/// 3.4 ms), so that every wait the model can see is one it may catch.
pub const AUTO_TEST_MAX_NS: u64 = 4_000_000;
/// The wake-up price the automatic-window tests give: 10 s, far above any wait, so that the
/// model's choice never depends on how long this machine takes to wake a thread.
pub const AUTO_TEST_WAKE_NS: u64 = 10_000_000_000;

/// Refusals are typed and hand the request (and its buffer) back.
pub fn bad_input_is_refused_with_the_request_handed_back<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let e = engine
        .submit(Request::read(&file, 0, AlignedBuf::new(0), 1))
        .unwrap_err();
    assert!(matches!(e.error, RequestError::ZeroLength { .. }));
    assert_eq!(e.request.token, 1);
    let e = engine
        .submit(Request::write(
            &file,
            i64::MAX as u64 - 10,
            AlignedBuf::new(BLOCK),
            2,
        ))
        .unwrap_err();
    assert!(matches!(e.error, RequestError::OffsetOutOfRange { .. }));
    let back = e.request.op.into_buffers().into_one().unwrap();
    assert_eq!(back.len(), BLOCK, "the buffer comes back");
    let io: std::io::Error = RequestError::ZeroLength { op: "read" }.into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    // A duplicate outlives the caller's own fd and reads the same file.
    let dup = {
        let f = File::open(tmp.path()).unwrap();
        IoFile::dup(&f).unwrap()
    };
    assert_ne!(dup.raw_fd(), file.raw_fd());
    let done = submit_all(
        &mut engine,
        vec![Request::read(&dup, 0, AlignedBuf::new(BLOCK), 4)],
    );
    assert_eq!(ok(&done[0]), BLOCK);
    // Still working.
    let done = submit_all(
        &mut engine,
        vec![Request::read(&file, 0, AlignedBuf::new(BLOCK), 3)],
    );
    assert_eq!(ok(&done[0]), BLOCK);
    assert_eq!(engine.in_flight(), 0);
}

/// Attached to a context: completions arrive in the callback, in the loop.
pub fn attached_engine_delivers_in_the_loop<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 8);
    let file = tmp.open(0).unwrap();
    let got: Rc<RefCell<Vec<u64>>> = Rc::default();
    let g = got.clone();
    let attached = ctx
        .attach_engine(engine(), move |_ctx, c| {
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK));
            g.borrow_mut().push(c.token);
        })
        .unwrap();
    for t in 0..64u64 {
        attached.submit(read_block(&file, t, t)).unwrap();
    }
    super::poll_until(&ctx, "64 completions", || got.borrow().len() == 64);
    let mut tokens = got.borrow().clone();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..64).collect::<Vec<_>>());
    assert_eq!(attached.in_flight(), 0);
    assert_eq!(attached.delivered(), 64);
    // Detaching with another context is refused and hands the handle back.
    let other = AioContext::new(monitor()).unwrap();
    let (e, attached) = match attached.detach(&other) {
        Ok(_) => panic!("detach from another context succeeded"),
        Err(refused) => refused,
    };
    assert!(matches!(e, aio_core::AioError::WrongContext), "{e}");
    drop(other);
    let Ok(engine) = attached.detach(&ctx) else {
        panic!("detach refused");
    };
    assert_eq!(engine.in_flight(), 0);
    assert_eq!(ctx.fd_handler_count(), 0);
}

/// A completion callback that runs a nested `poll()` until later requests complete: each
/// completion is delivered exactly once, none is lost, nothing deadlocks.
pub fn nested_poll_in_a_completion_callback_loses_and_duplicates_nothing<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 6);
    let file = tmp.open(0).unwrap();
    let delivered: Rc<RefCell<Vec<u64>>> = Rc::default();
    let nested_done = Rc::new(Cell::new(false));
    let first = Rc::new(Cell::new(true));
    let (d, n) = (delivered.clone(), nested_done.clone());
    let attached = ctx
        .attach_engine(engine(), move |ctx, c| {
            d.borrow_mut().push(c.token);
            if first.replace(false) {
                ctx.poll(false);
                // Wait inside the callback for every other request (QEMU's nested
                // aio_poll in a completion path).
                let dog = super::watchdog(ctx, Duration::from_secs(20));
                while d.borrow().len() < 16 {
                    assert!(!dog.get(), "nested loop never saw the other completions");
                    ctx.poll(true);
                }
                n.set(true);
            }
        })
        .unwrap();
    attached.plug();
    for t in 0..16u64 {
        attached.submit(read_block(&file, t, t)).unwrap();
    }
    attached.unplug();
    super::poll_until(&ctx, "all completions", || nested_done.get());
    while ctx.poll(false) {}
    let mut tokens = delivered.borrow().clone();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..16).collect::<Vec<_>>(), "each exactly once");
    assert!(ctx.counters().max_nesting >= 2);
    assert_eq!(attached.in_flight(), 0);
    assert!(
        attached.safety_net_runs() >= 1,
        "the nested loop was served by the safety-net bottom half"
    );
}

/// A completion callback submits a request and waits for it in a nested loop (the
/// submission is made while the driver batches the callbacks' submissions): the request must
/// still go out and complete.
pub fn callback_that_submits_and_waits_in_a_nested_loop_is_not_stuck_in_a_batch<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    use aio_loop::AttachedEngine;
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(8 * BLOCK, 3);
    let file = tmp.open(0).unwrap();
    let slot: Rc<RefCell<Option<AttachedEngine<L, E>>>> = Rc::default();
    let delivered: Rc<RefCell<Vec<u64>>> = Rc::default();
    let (s, d, f) = (slot.clone(), delivered.clone(), file.clone());
    let attached = ctx
        .attach_engine(engine(), move |ctx, c| {
            d.borrow_mut().push(c.token);
            if c.token < 4 {
                // Chain: each of the first four submits a follow-up and waits for it.
                let next = 100 + c.token;
                s.borrow()
                    .as_ref()
                    .unwrap()
                    .submit(Request::read(&f, 0, AlignedBuf::new(BLOCK), next))
                    .unwrap();
                let dog = super::watchdog(ctx, Duration::from_secs(20));
                while !d.borrow().contains(&next) {
                    assert!(!dog.get(), "the follow-up {next} never completed");
                    ctx.poll(true);
                }
            }
        })
        .unwrap();
    *slot.borrow_mut() = Some(attached);
    {
        let guard = slot.borrow();
        let engine = guard.as_ref().unwrap();
        engine.plug();
        for t in 0..4u64 {
            engine.submit(read_block(&file, t, t)).unwrap();
        }
        engine.unplug();
    }
    super::poll_until(&ctx, "eight completions", || delivered.borrow().len() == 8);
    let mut tokens = delivered.borrow().clone();
    tokens.sort_unstable();
    assert_eq!(tokens, [0, 1, 2, 3, 100, 101, 102, 103]);
    let attached = slot.borrow_mut().take().unwrap();
    assert_eq!(attached.in_flight(), 0);
}

/// Faults injected by [`FaultyEngine`](super::faults::FaultyEngine) (every 7th request fails
/// with EIO, token 3 with ENOSPC, completions held 200 µs and reordered) around the engine,
/// attached to a loop, and errors the engine itself gets from the kernel (every 5th write goes
/// to a read-only fd: EBADF, through the engine's own error path, delayed and reordered with
/// the rest): every request completes exactly once, each error is reported against its own
/// request with its errno, and every other write is on disk.
pub fn injected_faults_are_reported_against_their_own_requests<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    use super::faults::{FaultPlan, FaultyEngine};
    const N: u64 = 512;
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(N as usize * BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let read_only = tmp.open_read_only();
    // Tokens the wrapper fails before the engine sees them, and those the kernel refuses.
    let injected = |t: u64| t == 3 || (t + 1) % 7 == 0;
    let refused = |t: u64| !injected(t) && t % 5 == 2;
    let plan = FaultPlan {
        fail_every: Some((7, libc::EIO)),
        fail_tokens: vec![(3, libc::ENOSPC)],
        delay: Duration::from_micros(200),
        reorder: true,
        ..FaultPlan::default()
    };
    let faulty = FaultyEngine::new(engine(), plan).unwrap();
    let results: Rc<RefCell<Vec<Option<Option<i32>>>>> =
        Rc::new(RefCell::new(vec![None; N as usize]));
    let r = results.clone();
    let attached = ctx
        .attach_engine(faulty, move |_ctx, c| {
            let slot = &mut r.borrow_mut()[c.token as usize];
            assert!(slot.is_none(), "token {} completed twice", c.token);
            if let Ok(n) = &c.result {
                assert_eq!(*n, BLOCK, "token {}", c.token);
            }
            *slot = Some(c.errno());
        })
        .unwrap();
    // Submission n (from 1) carries token n - 1, so the 7th, 14th, ... fail: tokens 6, 13, ...
    for t in 0..N {
        let fill = (t % 251) as u8 + 1;
        attached
            .submit(Request::write(
                if t % 5 == 2 { &read_only } else { &file },
                t * BLOCK as u64,
                AlignedBuf::from_slice(&[fill; BLOCK]),
                t,
            ))
            .unwrap();
    }
    super::poll_until(&ctx, "every faulted and real completion", || {
        results.borrow().iter().all(Option::is_some)
    });
    let Ok(faulty) = attached.detach(&ctx) else {
        panic!("detach refused");
    };
    let stats = faulty.stats();
    let expected_failures = (0..N).filter(|&t| injected(t)).count() as u64;
    assert_eq!(stats.failed, expected_failures);
    assert_eq!(stats.forwarded, N - expected_failures);
    assert!(stats.delayed >= N, "every completion was held");
    assert_each_error_on_its_request(&results.borrow(), &tmp.contents(), refused);
}

/// What [`injected_faults_are_reported_against_their_own_requests`] checks of each request:
/// token 3 failed with ENOSPC, every 7th with EIO, those `refused` with EBADF, and the block of
/// each of those is untouched (zero) while every other block holds its write's fill.
fn assert_each_error_on_its_request(
    results: &[Option<Option<i32>>],
    content: &[u8],
    refused: impl Fn(u64) -> bool,
) {
    for (t, got) in results.iter().enumerate() {
        let t64 = t as u64;
        let want = if t64 == 3 {
            Some(libc::ENOSPC)
        } else if (t64 + 1) % 7 == 0 {
            Some(libc::EIO)
        } else if refused(t64) {
            Some(libc::EBADF)
        } else {
            None
        };
        assert_eq!(*got, Some(want), "token {t}");
        let block = &content[t * BLOCK..(t + 1) * BLOCK];
        let fill = if want.is_some() {
            0
        } else {
            (t % 251) as u8 + 1
        };
        assert!(
            block.iter().all(|&b| b == fill),
            "token {t}: block holds {:#x}, expected {fill:#x}",
            block[0]
        );
    }
}

/// A context and its attached engine dropped with thousands of requests in flight, ten times:
/// nothing crashes, hangs or writes memory that was freed (run under a memory checker, see
/// `scripts/memcheck.sh`), and the file holds only data some request wrote.
pub fn context_dropped_with_thousands_in_flight<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    const N: u64 = 2048;
    let tmp = TempFile::with_len(256 * BLOCK, 0);
    for round in 0..10u8 {
        let ctx = AioContext::new(monitor()).unwrap();
        let file = tmp.open(0).unwrap();
        let attached = ctx.attach_engine(engine(), |_ctx, _c| {}).unwrap();
        attached.plug();
        for t in 0..N {
            let req = if t % 2 == 0 {
                Request::write(
                    &file,
                    (t % 256) * BLOCK as u64,
                    AlignedBuf::from_slice(&[round | 1; BLOCK]),
                    t,
                )
            } else {
                read_block(&file, t % 256, t)
            };
            attached.submit(req).unwrap();
        }
        attached.unplug();
        // One turn of the loop so some completions are in user space, then drop everything.
        ctx.poll(false);
        drop(attached);
        drop(ctx);
        let content = tmp.contents();
        for (i, block) in content.chunks(BLOCK).enumerate() {
            let first = block[0];
            assert!(
                block.iter().all(|&b| b == first),
                "round {round}: block {i} torn"
            );
            assert!(
                first == 0 || (first & 1 == 1 && first <= (round | 1)),
                "round {round}: block {i} holds {first:#x}"
            );
        }
    }
}

/// Calls deferred from completion callbacks (a virtqueue's interrupt, QEMU's `defer_call()`)
/// wait for the end of the delivery they are made in: inside a callback the call is pending,
/// never run, and it runs once after that delivery's callbacks, before the next delivery's.
pub fn completion_callbacks_defer_calls_to_the_end_of_their_batch<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    const N: u64 = 64;
    const IRQ: u64 = u64::MAX;
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(N as usize * BLOCK, 5);
    let file = tmp.open(0).unwrap();
    // The completions' tokens in delivery order, and IRQ where the deferred call ran.
    let log: Rc<RefCell<Vec<u64>>> = Rc::default();
    let l = log.clone();
    let irq = ctx.deferred_call(move || l.borrow_mut().push(IRQ));
    let l = log.clone();
    let attached = ctx
        .attach_engine(engine(), move |_ctx, c| {
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK), "token {}", c.token);
            l.borrow_mut().push(c.token);
            irq.call();
            assert!(irq.is_pending(), "inside a delivery the call waits");
        })
        .unwrap();
    for t in 0..N {
        attached.submit(read_block(&file, t, t)).unwrap();
    }
    super::poll_until(&ctx, "every completion and the interrupt after it", || {
        let log = log.borrow();
        log.iter().filter(|&&x| x != IRQ).count() == N as usize && log.last() == Some(&IRQ)
    });
    let log = log.borrow();
    let irqs = log.iter().filter(|&&x| x == IRQ).count();
    assert!((1..=N as usize).contains(&irqs), "{irqs} interrupts");
    assert_ne!(log[0], IRQ, "an interrupt before any completion");
    for pair in log.windows(2) {
        assert!(
            pair != [IRQ, IRQ],
            "two interrupts for one batch, or one with no completion: {log:?}"
        );
    }
    let mut tokens: Vec<u64> = log.iter().copied().filter(|&x| x != IRQ).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..N).collect::<Vec<_>>(), "each completion once");
    drop(attached.detach(&ctx).map_err(|(e, _)| e).unwrap());
}
