//! Cross-thread stress of the iothreads and the async layer (ignored by default; 60 s):
//!
//! ```sh
//! cargo test --release -p aio-bench --test stress -- --ignored --nocapture
//! AIO_STRESS_SECS=10 cargo test --release -p aio-bench --test stress -- --ignored --nocapture
//! ```
//!
//! Two iothreads, each with its own epoll loop and every engine this kernel offers (pool,
//! linux-aio, uring) attached; on each, a task per engine keeps 32 writes and reads in flight,
//! every block stamped with its offset and a generation and checked when read back. Meanwhile 8
//! threads schedule bottom halves on both iothreads and wake tasks that wait for them. Nothing
//! may be lost: every bottom-half schedule is seen, every wake completes its task's wait, every
//! block reads back as last written, and the fds and RSS at the end equal those at the start.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use aio::EngineKind;
use aio_backend_epoll::EpollLoop;
use aio_core::engine::{AlignedBuf, IoEngine, IoFile};
use aio_loop::task::join_all;
use aio_loop::AttachedEngine;
use aio_loop::{AioContext, IoThread};
use aio_test_support::data::stamp;
use aio_test_support::procfs::Proc;

const BLOCK: usize = 4096;
const BLOCKS: u64 = 256;

/// Block `block`'s content for write `generation` (`aio_test_support::data`'s stamp).
fn stamped(block: u64, generation: u64) -> AlignedBuf {
    let mut b = AlignedBuf::new(BLOCK);
    stamp(&mut b, block * BLOCK as u64, generation);
    b
}

type Engines = Vec<AttachedEngine<EpollLoop, Box<dyn IoEngine>>>;

/// One engine's task: rounds of 32 writes of new generations, then 32 reads checked.
async fn verify_loop(
    engine: AttachedEngine<EpollLoop, Box<dyn IoEngine>>,
    file: IoFile,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Result<u64, String> {
    let mut generation = 1u64;
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) {
        let first = (rounds * 32) % BLOCKS;
        let writes = (first..first + 32).map(|b| {
            let g = generation + b;
            engine.write(&file, b * BLOCK as u64, stamped(b, g))
        });
        for (r, _) in join_all(writes).await {
            r.map_err(|e| format!("write: {e}"))?;
        }
        let reads = (first..first + 32)
            .map(|b| engine.read(&file, b * BLOCK as u64, AlignedBuf::new(BLOCK)));
        for (b, (r, buf)) in (first..first + 32).zip(join_all(reads).await) {
            r.map_err(|e| format!("read: {e}"))?;
            if buf != stamped(b, generation + b) {
                return Err(format!(
                    "block {b} generation {} read back wrong",
                    generation + b
                ));
            }
        }
        generation += BLOCKS;
        rounds += 1;
        done.fetch_add(64, Ordering::Relaxed);
    }
    Ok(rounds)
}

/// Waits (at most 30 s) until `done()` holds.
fn settle(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what} never settled");
        std::thread::sleep(Duration::from_millis(10));
    }
}

type Outcome = Arc<Mutex<Option<Result<u64, String>>>>;

#[test]
#[ignore = "a 60-second stress run; run it with --ignored (command in the README)"]
fn two_iothreads_eight_threads_every_engine_nothing_lost() {
    let secs: u64 = std::env::var("AIO_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let kinds: Vec<EngineKind> = EngineKind::available();
    // After the probe (which may keep what it probed with for the process).
    let me = Proc::current();
    let (fds_before, rss_before, targets_before) = (me.fd_count(), me.rss_kib(), me.fd_targets());
    let dir = tempfile::tempdir().expect("temp dir");
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let mut iothreads = Vec::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for t in 0..2 {
        let k = kinds.clone();
        let iothread = IoThread::spawn(&format!("stress{t}"), move || {
            let ctx = AioContext::new(EpollLoop::new()?)?;
            let mut engines: Engines = Vec::new();
            for kind in &k {
                let e: Box<dyn IoEngine> = kind.build(&aio::EngineOptions::default())?;
                engines.push(ctx.attach_engine(e, |_, _| {})?);
            }
            Ok::<_, Box<dyn std::error::Error>>((ctx, engines))
        })
        .expect("iothread");
        for i in 0..kinds.len() {
            let path = dir.path().join(format!("t{t}-e{i}.img"));
            std::fs::write(&path, vec![0u8; BLOCKS as usize * BLOCK]).unwrap();
            let outcome: Outcome = Arc::default();
            let (o, stop, done) = (outcome.clone(), stop.clone(), requests.clone());
            iothread
                .run(move |ctx, engines: &Engines| {
                    let f = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&path);
                    let file = IoFile::from(f.expect("open the image"));
                    let run = verify_loop(engines[i].clone(), file, stop, done);
                    ctx.spawn(async move {
                        let r = run.await;
                        *o.lock().unwrap() = Some(r);
                    });
                })
                .unwrap();
            outcomes.push(outcome);
        }
        iothreads.push(iothread);
    }
    // 8 threads: each schedules a bottom half on both iothreads and wakes a task it spawned.
    let scheduled = Arc::new(AtomicU64::new(0));
    let ran = Arc::new(AtomicU64::new(0));
    let wakes_done = Arc::new(AtomicU64::new(0));
    let pollers: Vec<_> = (0..8)
        .map(|p| {
            let handles: Vec<_> = iothreads.iter().map(|t| t.handle()).collect();
            let (stop, scheduled, ran, wakes_done) = (
                stop.clone(),
                scheduled.clone(),
                ran.clone(),
                wakes_done.clone(),
            );
            std::thread::spawn(move || {
                let bhs: Vec<_> = handles
                    .iter()
                    .map(|h| {
                        let r = ran.clone();
                        h.bh_new(move |_| {
                            r.fetch_add(1, Ordering::Relaxed);
                        })
                        .unwrap()
                    })
                    .collect();
                let mut woken = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let h = &handles[(woken as usize + p) % handles.len()];
                    let slot: Arc<Mutex<(bool, Option<Waker>)>> = Arc::default();
                    let finished = Arc::new(AtomicBool::new(false));
                    let (s, done, fin) = (slot.clone(), wakes_done.clone(), finished.clone());
                    h.run(move |ctx, _| {
                        ctx.spawn(std::future::poll_fn(move |cx| {
                            let mut st = s.lock().unwrap();
                            if st.0 {
                                done.fetch_add(1, Ordering::Relaxed);
                                fin.store(true, Ordering::Release);
                                return std::task::Poll::Ready(());
                            }
                            st.1 = Some(cx.waker().clone());
                            std::task::Poll::Pending
                        }));
                    })
                    .unwrap();
                    for bh in &bhs {
                        assert!(bh.schedule(), "a live bottom half takes a schedule");
                        scheduled.fetch_add(1, Ordering::Relaxed);
                    }
                    // Set the flag; wake the task if it already waits (else its first poll
                    // sees the flag).
                    let waker = {
                        let mut st = slot.lock().unwrap();
                        st.0 = true;
                        st.1.take()
                    };
                    if let Some(w) = waker {
                        w.wake();
                    }
                    woken += 1;
                    // One task in flight per thread: the iothreads' queues stay short.
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !finished.load(Ordering::Acquire) {
                        assert!(Instant::now() < deadline, "a woken task never finished");
                        std::thread::yield_now();
                    }
                }
                (woken, bhs)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let (mut woken, mut bhs) = (0, Vec::new());
    for p in pollers {
        let (n, b) = p.join().unwrap();
        woken += n;
        bhs.extend(b);
    }
    settle("the verify tasks", || {
        outcomes.iter().all(|o| o.lock().unwrap().is_some())
    });
    for o in &outcomes {
        let r = o.lock().unwrap().take().unwrap();
        assert!(r.is_ok(), "a verify task failed: {r:?}");
    }
    settle("the wakes", || wakes_done.load(Ordering::Relaxed) == woken);
    // Every schedule is seen: none is left pending (repeated schedules of a pending bottom
    // half merge into one run, so runs never exceed schedules).
    settle("the bottom halves", || {
        bhs.iter().all(|bh| !bh.is_scheduled())
    });
    assert!(ran.load(Ordering::Relaxed) <= scheduled.load(Ordering::Relaxed));
    for t in iothreads {
        assert!(t.take_panics().is_empty());
        t.stop().unwrap();
    }
    // The bottom-half handles keep their contexts' notifiers open until they go.
    drop(bhs);
    drop(dir);
    let (fds_after, rss_after) = (me.fd_count(), me.rss_kib());
    eprintln!(
        "stress: {secs} s, {} engines x 2 iothreads: {} requests verified, {woken} cross-thread \
         wakes, {} bottom-half schedules in {} runs; fds {fds_before} -> {fds_after}, RSS {rss_before} -> \
         {rss_after} KiB",
        kinds.len(),
        requests.load(Ordering::Relaxed),
        scheduled.load(Ordering::Relaxed),
        ran.load(Ordering::Relaxed),
    );
    assert!(requests.load(Ordering::Relaxed) > 0 && woken > 0);
    assert_eq!(
        fds_after,
        fds_before,
        "fds leaked: {targets_before:?} -> {:?}",
        me.fd_targets()
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew by more than 64 MiB"
    );
}
