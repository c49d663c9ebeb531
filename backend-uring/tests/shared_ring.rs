//! One ring for the fd monitor and the engine: the engine conformance suite, run with a
//! monitor and an engine built together by `shared_ring` (block I/O completions arrive with
//! the monitor's, without an eventfd), on files and on loop devices.

use std::cell::RefCell;
use std::rc::Rc;

use aio_backend_uring::{probe, UringConfig, UringEngine, UringLoop};

mod common;

/// Builds a pair on whichever half the suite asks for first, and a new pair whenever the half
/// asked for was already given out (tests that build an engine or a context per round; the
/// engine-only tests never ask for the monitor).
fn pair() -> Option<(impl Fn() -> UringEngine, impl Fn() -> UringLoop)> {
    if !common::available() {
        return None;
    }
    type Halves = (Option<UringLoop>, Option<UringEngine>);
    let halves: Rc<RefCell<Option<Halves>>> = Rc::default();
    let build = |halves: &Rc<RefCell<Option<Halves>>>, want_engine: bool| {
        let mut h = halves.borrow_mut();
        let gone = match h.as_ref() {
            None => true,
            Some((m, e)) => (want_engine && e.is_none()) || (!want_engine && m.is_none()),
        };
        if gone {
            let (monitor, engine) = common::shared(UringConfig::default());
            assert!(monitor.is_shared() && engine.is_shared());
            *h = Some((Some(monitor), Some(engine)));
        }
    };
    let (h1, h2) = (halves.clone(), halves);
    let engine = move || {
        build(&h1, true);
        let engine = h1.borrow_mut().as_mut().and_then(|(_, e)| e.take());
        engine.expect("one engine per pair")
    };
    let monitor = move || {
        build(&h2, false);
        let monitor = h2.borrow_mut().as_mut().and_then(|(m, _)| m.take());
        monitor.expect("one monitor per pair")
    };
    Some((engine, monitor))
}

// The whole engine suite on a fresh pair per test, on files and on loop devices, but for the
// two tests that do not apply: the iothread test builds its engine on another thread, which a
// shared ring, built with its monitor on this one, cannot be; and a shared ring's engine never
// writes its notifier (the monitor reports the engine's completions from the one completion
// queue), which `notifier_signals_every_completion_batch` checks for.
aio_conformance::engine_conformance!(pair: crate::pair());

/// The engine of a shared ring says completions wait exactly while its completion queue holds
/// some: the fd monitor reports the engine ready from it, with no eventfd to read.
#[test]
fn a_shared_ring_says_when_completions_wait() {
    use aio_conformance::engine::{read_block, TempFile, BLOCK};
    use aio_core::engine::IoEngine;
    if aio_conformance::available("io_uring unusable", probe()).is_none() {
        return;
    }
    let (_monitor, mut engine) = common::shared(UringConfig::default());
    let tmp = TempFile::with_len(4 * BLOCK, 9);
    let file = tmp.open(0).unwrap();
    assert!(!engine.has_completions(), "nothing submitted");
    engine.submit(read_block(&file, 0, 1)).unwrap();
    // A read from the page cache completes inside the submitting enter.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !engine.has_completions() {
        assert!(
            std::time::Instant::now() < deadline,
            "the read never completed"
        );
        std::thread::yield_now();
    }
    let done = aio_conformance::engine::wait_for(&mut engine, 1);
    assert_eq!(done[0].result.as_ref().ok(), Some(&BLOCK));
    assert!(!engine.has_completions(), "all reaped");
}
