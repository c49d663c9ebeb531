//! Every monitor and every engine inside an [`IoThread`]: built on its thread, driven from
//! other threads through the handle.
//!
//! This module owns those two tests; the conformance macros run them for every backend.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fixtures::{TempFile, BLOCK};
use super::{write_byte, Pipe};
use aio_core::engine::{AlignedBuf, IoEngine};
use aio_core::{AioError, EventLoop};
use aio_loop::task::join_all;
use aio_loop::AttachedEngine;
use aio_loop::{AioContext, FdHandler, IoThread};

/// A monitor inside an iothread: an fd handler registered through the handle runs for bytes
/// written by another thread, and bottom halves scheduled from 4 threads run.
pub fn monitor_runs_inside_an_iothread<L: EventLoop + 'static>(
    make: impl Fn() -> L + Send + 'static,
) {
    let iothread = IoThread::spawn("conformance-monitor", move || {
        Ok::<_, AioError>((AioContext::new(make())?, ()))
    })
    .unwrap();
    let pipe = Arc::new(Pipe::new());
    let reads = Arc::new(AtomicUsize::new(0));
    let (p, r) = (pipe.clone(), reads.clone());
    iothread
        .call(move |ctx, _| {
            let (p2, r2) = (p.clone(), r.clone());
            ctx.set_fd_handler(
                &p.read,
                FdHandler::new().on_read(move |_| {
                    r2.fetch_add(super::drain_fd(&p2.read), Ordering::Relaxed);
                }),
            )
        })
        .unwrap()
        .unwrap();
    let bh_runs = Arc::new(AtomicUsize::new(0));
    let b = bh_runs.clone();
    let bh = iothread
        .bh_new(move |_| {
            b.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (bh, pipe) = (bh.clone(), pipe.clone());
            std::thread::spawn(move || {
                for _ in 0..25 {
                    write_byte(&pipe.write);
                    bh.schedule();
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while reads.load(Ordering::Relaxed) < 100 || bh_runs.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "the iothread's loop is not serving"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let p = pipe.clone();
    iothread
        .call(move |ctx, _| ctx.remove_fd_handler(&p.read))
        .unwrap()
        .unwrap();
    iothread.stop().unwrap();
}

/// An engine built and attached inside an iothread, driven from 4 threads: each writes and
/// reads its own blocks at QD 32 through `call` + `block_on`, and the data checks out. The
/// iothread polls with the automatic window, which its counters show choosing.
pub fn engine_runs_inside_an_iothread<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E + Send + 'static,
    monitor: impl Fn() -> L + Send + 'static,
) {
    let iothread = IoThread::spawn("conformance-engine", move || {
        let ctx = AioContext::new(monitor())?;
        let attached = ctx.attach_engine(engine(), |_, _| {})?;
        Ok::<_, AioError>((ctx, attached))
    })
    .unwrap();
    // A wake-up priced far above any wait: the window polls for every wait up to its cap,
    // whatever this machine's wake-ups cost.
    let auto = aio_loop::PollParams::auto()
        .with_max_ns(super::engine_loop::AUTO_TEST_MAX_NS)
        .with_wake_ns(super::engine_loop::AUTO_TEST_WAKE_NS);
    iothread.handle().set_poll_params(auto).unwrap();
    let tmp = Arc::new(TempFile::with_len(4 * 32 * BLOCK, 0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (handle, tmp) = (iothread.handle(), tmp.clone());
            std::thread::spawn(move || {
                let file = tmp.open(0).unwrap();
                let blocks: Vec<u64> = (t * 32..(t + 1) * 32).collect();
                let (f, b) = (file.clone(), blocks.clone());
                let written = handle
                    .call(move |ctx, engine: &AttachedEngine<L, E>| {
                        let writes = b.iter().map(|&i| {
                            let buf = AlignedBuf::from_slice(&[i as u8 + 1; BLOCK]);
                            engine.write(&f, i * BLOCK as u64, buf)
                        });
                        ctx.block_on(join_all(writes))
                            .into_iter()
                            .all(|(r, _)| r.ok() == Some(BLOCK))
                    })
                    .unwrap();
                assert!(written);
                handle
                    .call(move |ctx, engine: &AttachedEngine<L, E>| {
                        let reads = blocks
                            .iter()
                            .map(|&i| engine.read(&file, i * BLOCK as u64, AlignedBuf::new(BLOCK)));
                        ctx.block_on(join_all(reads)).into_iter().zip(&blocks).all(
                            |((r, buf), &i)| {
                                r.ok() == Some(BLOCK) && buf.iter().all(|&x| x == i as u8 + 1)
                            },
                        )
                    })
                    .unwrap()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap(), "a thread's blocks read back wrong");
    }
    let c = iothread.handle().counters().unwrap();
    assert_eq!(
        c.poll_wake_ns,
        super::engine_loop::AUTO_TEST_WAKE_NS,
        "the iothread's own model: {c:?}"
    );
    assert!(c.poll_attempts > 0, "the iothread polled: {c:?}");
    assert_eq!(c.poll_auto_off, 0, "{c:?}");
    iothread.stop().unwrap();
}
