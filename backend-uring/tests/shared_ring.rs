//! One ring for the fd monitor and the engine: the loop-level engine conformance tests, run
//! with a monitor and an engine built together by `shared_ring` (block I/O completions arrive
//! with the monitor's, without an eventfd).

use std::cell::RefCell;
use std::rc::Rc;

use aio_backend_uring::{probe, shared_ring, UringConfig, UringEngine, UringLoop};
use aio_core::testing::engine as suite;

/// Builds the pair once; the suite asks for the monitor first, then the engine.
fn pair() -> Option<(impl Fn() -> UringEngine, impl Fn() -> UringLoop)> {
    aio_core::testing::available("io_uring unusable", probe())?;
    let engine_slot: Rc<RefCell<Option<UringEngine>>> = Rc::default();
    let e = engine_slot.clone();
    let monitor = move || {
        let (monitor, engine) = shared_ring(UringConfig::default()).expect("shared ring");
        assert!(monitor.is_shared() && engine.is_shared());
        *e.borrow_mut() = Some(engine);
        monitor
    };
    let engine = move || {
        engine_slot
            .borrow_mut()
            .take()
            .expect("monitor built first")
    };
    Some((engine, monitor))
}

#[test]
fn shared_ring_delivers_in_the_loop() {
    if let Some((engine, monitor)) = pair() {
        suite::attached_engine_delivers_in_the_loop(engine, monitor);
    }
}

#[test]
fn shared_ring_qd1_without_polling() {
    if let Some((engine, monitor)) = pair() {
        suite::qd1_through_the_loop_without_polling(engine, monitor);
    }
}

#[test]
fn shared_ring_nested_poll() {
    if let Some((engine, monitor)) = pair() {
        suite::nested_poll_in_a_completion_callback_loses_and_duplicates_nothing(engine, monitor);
    }
}

#[test]
fn shared_ring_callback_submits_and_waits() {
    if let Some((engine, monitor)) = pair() {
        suite::callback_that_submits_and_waits_in_a_nested_loop_is_not_stuck_in_a_batch(
            engine, monitor,
        );
    }
}

#[test]
fn shared_ring_cancel_is_delivered_without_an_eventfd() {
    use aio_core::engine::{AlignedBuf, Request};
    use aio_core::testing::engine::TempFile;
    use aio_core::AioContext;
    let Some((engine, monitor)) = pair() else {
        return;
    };
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(4096, 1);
    let file = tmp.open(0).unwrap();
    type Seen = Rc<RefCell<Vec<(u64, Option<i32>)>>>;
    let got: Seen = Rc::default();
    let g = got.clone();
    let attached = ctx
        .attach_engine(engine(), move |_, c| {
            g.borrow_mut().push((c.token, c.errno()))
        })
        .unwrap();
    attached.plug();
    // The batch rule: 1 and 2 go to the idle ring one by one; 3 waits for a batch of 2.
    for t in 1..=3 {
        attached
            .submit(Request::read(&file, 0, AlignedBuf::new(4096), t))
            .unwrap();
    }
    assert!(attached.cancel(3));
    attached.unplug();
    aio_core::testing::poll_until(&ctx, "three completions", || got.borrow().len() == 3);
    let mut v = got.borrow().clone();
    v.sort();
    assert_eq!(v, [(1, None), (2, None), (3, Some(libc::ECANCELED))]);
}

#[test]
fn monitor_removals_on_a_shared_ring_never_reach_the_engine() {
    use aio_core::engine::{AlignedBuf, Request};
    use aio_core::testing::engine::TempFile;
    use aio_core::testing::Pipe;
    use aio_core::{AioContext, FdHandler};
    let Some((engine, monitor)) = pair() else {
        return;
    };
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(4096, 1);
    let file = tmp.open(0).unwrap();
    let done = Rc::new(RefCell::new(0u32));
    let d = done.clone();
    let attached = ctx
        .attach_engine(engine(), move |_, c| {
            assert!(c.result.is_ok());
            *d.borrow_mut() += 1;
        })
        .unwrap();
    // Arm polls, then remove and re-add them many times: each removal of an armed poll posts
    // a POLL_REMOVE completion on the shared ring, which must stay the monitor's.
    let pipes: Vec<Pipe> = (0..8).map(|_| Pipe::new()).collect();
    for round in 0..20u64 {
        for p in &pipes {
            ctx.set_fd_handler(&p.read, FdHandler::new().on_read(|_| {}))
                .unwrap();
        }
        ctx.poll(false);
        for p in &pipes {
            ctx.remove_fd_handler(&p.read).unwrap();
        }
        attached
            .submit(Request::read(&file, 0, AlignedBuf::new(4096), round))
            .unwrap();
        let want = round as u32 + 1;
        aio_core::testing::poll_until(&ctx, "the read", || *done.borrow() == want);
    }
    assert_eq!(attached.in_flight(), 0);
    drop(attached);
    drop(ctx);
}

#[test]
fn registered_buffers_on_a_shared_ring_are_used_and_released_with_the_engine() {
    use aio_core::engine::{AlignedBuf, Request};
    use aio_core::testing::engine::TempFile;
    use aio_core::testing::Pipe;
    use aio_core::{AioContext, FdHandler};
    if aio_core::testing::available("io_uring unusable", probe()).is_none() {
        return;
    }
    let (monitor, engine) =
        shared_ring(UringConfig::default().with_fixed_buffers(4)).expect("shared ring");
    let ctx = AioContext::new(monitor).unwrap();
    let tmp = TempFile::with_len(8 * 4096, 9);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    let good = Rc::new(RefCell::new(0u32));
    let g = good.clone();
    let attached = ctx
        .attach_engine(engine, move |_, c| {
            assert_eq!(c.result.as_ref().ok(), Some(&4096));
            assert!(c.buf.into_one().unwrap().iter().all(|&b| b == 9));
            *g.borrow_mut() += 1;
        })
        .unwrap();
    for t in 0..8u64 {
        attached
            .submit(Request::read(&file, t * 4096, AlignedBuf::new(4096), t))
            .unwrap();
    }
    aio_core::testing::poll_until(&ctx, "eight reads", || *good.borrow() == 8);
    let stats = attached.with_engine(|e| e.stats());
    assert!(stats.fixed_buffer_requests >= 4, "{stats:?}");
    // The engine goes (unregistering its buffers); the ring stays the monitor's and works.
    let engine = attached.detach(&ctx).map_err(|(e, _)| e).unwrap();
    drop(engine);
    let pipe = Pipe::new();
    let seen = Rc::new(RefCell::new(false));
    let s = seen.clone();
    ctx.set_fd_handler(
        &pipe.read,
        FdHandler::new().on_read(move |_| *s.borrow_mut() = true),
    )
    .unwrap();
    aio_core::testing::write_byte(&pipe.write);
    aio_core::testing::poll_until(&ctx, "the pipe", || *seen.borrow());
}

#[test]
fn shared_ring_async_requests_at_qd32() {
    if let Some((engine, monitor)) = pair() {
        aio_core::testing::async_engine::async_requests_complete_exactly_once_at_qd32(
            engine, monitor,
        );
    }
}

#[test]
fn shared_ring_dropped_futures() {
    if let Some((engine, monitor)) = pair() {
        aio_core::testing::async_engine::dropped_futures_free_nothing_early_and_leak_nothing(
            engine, monitor,
        );
    }
}

#[test]
fn shared_ring_block_on_in_a_callback() {
    if let Some((engine, monitor)) = pair() {
        aio_core::testing::async_engine::block_on_inside_a_completion_callback(engine, monitor);
    }
}
