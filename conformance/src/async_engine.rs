//! The async part of the engine conformance suite: engine futures in tasks, cancellation by
//! drop, `block_on` inside a completion callback, cancel of requests in flight.
//!
//! This module owns those tests; [`engine_conformance!`](crate::engine_conformance) runs them
//! with the rest, for every engine.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use super::faults::{FaultPlan, FaultyEngine};
use super::fixtures::{wait_for, Rng, TempFile, BLOCK};
use super::live_buffers;
use aio_core::engine::{AlignedBuf, IoEngine, Request};
use aio_core::EventLoop;
use aio_loop::task::join_all;
use aio_loop::AioContext;

/// Writes and reads at QD 32 from tasks, with `join_all`: every future completes once, with
/// its buffer, and the data reads back; the engine-wide callback sees nothing.
pub fn async_requests_complete_exactly_once_at_qd32<E, L>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) where
    E: IoEngine + 'static,
    L: EventLoop + 'static,
{
    let ctx = AioContext::new(monitor()).unwrap();
    let stray = Rc::new(Cell::new(0));
    let s = stray.clone();
    let attached = ctx
        .attach_engine(engine(), move |_, _| s.set(s.get() + 1))
        .unwrap();
    const BLOCKS: u64 = 128;
    let tmp = TempFile::with_len(BLOCKS as usize * BLOCK, 0);
    let file = tmp.open_direct_or_say();
    let mut rng = Rng::new(15);
    let data: Vec<AlignedBuf> = (0..BLOCKS).map(|_| rng.buf(BLOCK)).collect();
    let expected: Vec<Vec<u8>> = data.iter().map(|b| b.to_vec()).collect();
    let (e, f) = (attached.clone(), file.clone());
    let task = ctx.spawn(async move {
        let mut data = data.into_iter().enumerate();
        loop {
            let batch: Vec<_> = data.by_ref().take(32).collect();
            if batch.is_empty() {
                break;
            }
            let writes = batch
                .into_iter()
                .map(|(i, buf)| e.write(&f, i as u64 * BLOCK as u64, buf));
            for (result, buf) in join_all(writes).await {
                assert_eq!(result.unwrap(), BLOCK);
                assert_eq!(buf.len(), BLOCK, "the buffer comes back");
            }
        }
        let mut back = Vec::new();
        for chunk in (0..BLOCKS).collect::<Vec<_>>().chunks(32) {
            let reads = chunk
                .iter()
                .map(|&i| e.read(&f, i * BLOCK as u64, AlignedBuf::new(BLOCK)));
            for (result, buf) in join_all(reads).await {
                assert_eq!(result.unwrap(), BLOCK);
                back.push(buf.to_vec());
            }
        }
        back
    });
    let back = ctx.block_on(task).unwrap();
    assert_eq!(back, expected);
    assert_eq!(stray.get(), 0, "futures' completions go to the futures");
    assert_eq!(attached.in_flight(), 0);
    drop(attached.detach(&ctx).map_err(|(e, _)| e).unwrap());
}

/// Futures dropped with their requests in flight (tasks aborted): the engine keeps the
/// buffers, and what `run_keeping` keeps with them, until the kernel or the worker is done
/// (nothing freed early), then the late completions are discarded and every buffer and kept
/// value is released (nothing leaked). The engine's completions are held back 200 ms (the
/// fault engine), so the requests are surely in flight when the futures go.
pub fn dropped_futures_free_nothing_early_and_leak_nothing<E, L>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) where
    E: IoEngine + 'static,
    L: EventLoop + 'static,
{
    let ctx = AioContext::new(monitor()).unwrap();
    let plan = FaultPlan {
        delay: Duration::from_millis(200),
        ..FaultPlan::default()
    };
    let slow = FaultyEngine::new(engine(), plan).expect("the delay alarm thread");
    let attached = ctx.attach_engine(slow, |_, _| {}).unwrap();
    let tmp = TempFile::with_len(16 * BLOCK, 3);
    let file = tmp.open(0).unwrap();
    let before = live_buffers();
    // What each request keeps (`run_keeping`): held as long as its buffer.
    let keep = Rc::new(());
    let kept = || Rc::strong_count(&keep) as isize - 1;
    let tasks: Vec<_> = (0..16u64)
        .map(|i| {
            let request = Request::read(&file, i * BLOCK as u64, AlignedBuf::new(BLOCK), i);
            let read = attached.run_keeping(request, keep.clone());
            ctx.spawn(async move {
                read.await.result.unwrap();
                unreachable!("aborted before the completion");
            })
        })
        .collect();
    assert_eq!(attached.in_flight(), 16);
    assert_eq!(live_buffers(), before + 16);
    assert_eq!(kept(), 16);
    for t in &tasks {
        t.abort();
    }
    // The aborted tasks' futures are dropped in the loop.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ctx.task_count() > 0 {
        assert!(std::time::Instant::now() < deadline, "aborted tasks linger");
        ctx.poll(false);
    }
    // Cancelled or not, every request is still the engine's until its completion arrives.
    let held = attached.in_flight();
    assert!(
        held > 0,
        "the engine gave the requests up before their completions"
    );
    assert_eq!(
        live_buffers() - before,
        held as isize,
        "nothing freed early"
    );
    assert_eq!(kept(), held as isize, "nothing kept released early");
    super::poll_until(&ctx, "the late completions", || attached.in_flight() == 0);
    assert_eq!(live_buffers(), before, "every buffer freed, none leaked");
    assert_eq!(kept(), 0, "every kept value released");
    for t in tasks {
        assert!(matches!(
            ctx.block_on(t),
            Err(aio_loop::task::JoinError::Aborted)
        ));
    }
}

/// `block_on` of an engine future inside a completion callback (a nested loop): it neither
/// deadlocks nor loses the other requests' completions.
pub fn block_on_inside_a_completion_callback<E, L>(engine: impl Fn() -> E, monitor: impl Fn() -> L)
where
    E: IoEngine + 'static,
    L: EventLoop + 'static,
{
    let ctx = AioContext::new(monitor()).unwrap();
    let attached = ctx.attach_engine(engine(), |_, _| {}).unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 9);
    let file = tmp.open(0).unwrap();
    let others = Rc::new(Cell::new(0));
    let nested_done = Rc::new(Cell::new(false));
    let (f, n) = (file.clone(), nested_done.clone());
    attached
        .submit_with(
            Request::read(&file, 0, AlignedBuf::new(BLOCK), 1),
            move |ctx, engine, c| {
                assert!(c.result.is_ok());
                let (result, buf) =
                    ctx.block_on(engine.read(&f, BLOCK as u64, AlignedBuf::new(BLOCK)));
                assert_eq!(result.unwrap(), BLOCK);
                assert!(buf.iter().all(|&b| b == 9));
                n.set(true);
            },
        )
        .unwrap();
    for i in 2..64u64 {
        let o = others.clone();
        attached
            .submit_with(
                Request::read(&file, i * BLOCK as u64, AlignedBuf::new(BLOCK), i),
                move |_, _, c| {
                    assert_eq!(c.token, i);
                    o.set(o.get() + 1);
                },
            )
            .unwrap();
    }
    super::poll_until(&ctx, "the nested block_on and 62 others", || {
        nested_done.get() && others.get() == 62
    });
    assert_eq!(attached.in_flight(), 0);
}

/// `cancel` right after `submit`, for 64 requests: each completes exactly once, with its
/// bytes or `ECANCELED`, its buffer back.
pub fn cancel_after_submit_completes_each_once<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(64 * BLOCK, 4);
    let file = tmp.open(0).unwrap();
    for i in 0..64u64 {
        engine
            .submit(Request::read(
                &file,
                i * BLOCK as u64,
                AlignedBuf::new(BLOCK),
                i,
            ))
            .unwrap();
        engine.cancel(i);
    }
    let mut done = wait_for(&mut engine, 64);
    done.sort_by_key(|c| c.token);
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.token, i as u64, "each once");
        match &c.result {
            Ok(n) => assert_eq!(*n, BLOCK),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ECANCELED), "{e}"),
        }
        assert_eq!(c.buf.count(), 1);
    }
    assert_eq!(engine.in_flight(), 0);
}
