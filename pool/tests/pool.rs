//! Pool-specific behaviour: thread accounting (QEMU's thread-pool idle-thread accounting),
//! limits, idle exit, cancel, shutdown, and the typed offload in the loop.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aio_backend_poll::PollLoop;
use aio_conformance::engine::{wait_for, wait_readable, TempFile};
use aio_conformance::poll_until;
use aio_core::engine::{AlignedBuf, IoEngine, Request, RequestError, RwFlags};
use aio_loop::AioContext;
use aio_pool::{PoolConfig, PoolContext, ThreadPool, WORK_TOKEN_BIT};

/// Work that blocks until `concurrency` of its kind run at once (or 10 s pass) and records the
/// highest concurrency it saw.
fn rendezvous(
    running: &Arc<AtomicUsize>,
    seen_max: &Arc<AtomicUsize>,
    want: usize,
) -> impl FnOnce() -> std::io::Result<usize> + Send + 'static {
    let (running, seen_max) = (running.clone(), seen_max.clone());
    move || {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        seen_max.fetch_max(now, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(30);
        while running.load(Ordering::SeqCst) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        seen_max.fetch_max(running.load(Ordering::SeqCst), Ordering::SeqCst);
        // Stay until everyone has seen the peak.
        std::thread::sleep(Duration::from_millis(20));
        running.fetch_sub(1, Ordering::SeqCst);
        Ok(0)
    }
}

#[test]
fn sixteen_blocking_requests_run_at_once_and_idle_threads_are_reused() {
    let mut pool = ThreadPool::new(PoolConfig::default()).unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let seen_max = Arc::new(AtomicUsize::new(0));
    for t in 0..16 {
        pool.submit_work(t, rendezvous(&running, &seen_max, 16))
            .unwrap();
    }
    let done = wait_for(&mut pool, 16);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(
        seen_max.load(Ordering::SeqCst),
        16,
        "the requests themselves saw 16 running at once"
    );
    let stats = pool.stats();
    assert_eq!(stats.spawned, 16);
    assert_eq!(stats.peak_threads, 16);
    // All 16 wait for work now; a second burst reuses them (idle = waiting, as QEMU counts).
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.stats().idle < 16 {
        assert!(
            Instant::now() < deadline,
            "threads never became idle: {:?}",
            pool.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    seen_max.store(0, Ordering::SeqCst);
    for t in 16..32 {
        pool.submit_work(t, rendezvous(&running, &seen_max, 16))
            .unwrap();
    }
    wait_for(&mut pool, 16);
    assert_eq!(seen_max.load(Ordering::SeqCst), 16);
    assert_eq!(
        pool.stats().spawned,
        16,
        "idle threads were reused, none spawned"
    );
    assert!(pool.stats().notifier_writes <= 32);
}

#[test]
fn max_threads_is_respected_and_work_queues() {
    let mut pool = ThreadPool::new(PoolConfig::default().with_max_threads(4)).unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let seen_max = Arc::new(AtomicUsize::new(0));
    for t in 0..12 {
        pool.submit_work(t, rendezvous(&running, &seen_max, 4))
            .unwrap();
    }
    assert!(
        pool.stats().queued >= 8 - 4,
        "work beyond the threads queues"
    );
    let done = wait_for(&mut pool, 12);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    assert_eq!(seen_max.load(Ordering::SeqCst), 4);
    assert_eq!(pool.stats().peak_threads, 4);
}

#[test]
fn threads_above_the_minimum_exit_after_the_idle_timeout() {
    let mut pool = ThreadPool::new(
        PoolConfig::default()
            .with_max_threads(8)
            .with_min_threads(2)
            .with_idle_timeout(Duration::from_millis(100)),
    )
    .unwrap();
    assert_eq!(pool.stats().threads, 2, "min_threads start at once");
    let running = Arc::new(AtomicUsize::new(0));
    let seen_max = Arc::new(AtomicUsize::new(0));
    for t in 0..8 {
        pool.submit_work(t, rendezvous(&running, &seen_max, 8))
            .unwrap();
    }
    wait_for(&mut pool, 8);
    // The peak, not the count now: a worker idle for 100 ms may already have left if this
    // thread was slow to look.
    assert_eq!(pool.stats().peak_threads, 8);
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.stats().threads > 2 {
        assert!(
            Instant::now() < deadline,
            "idle threads did not exit: {:?}",
            pool.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The minimum stays through idle timeouts: wait for two more of them (a counter, not a
    // sleep) and count the threads again.
    let timeouts = pool.stats().idle_timeouts;
    while pool.stats().idle_timeouts < timeouts + 2 {
        assert!(Instant::now() < deadline, "no idle timeout at the minimum");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.stats().threads, 2, "the minimum stays");
    // Limits change at run time.
    pool.set_config(
        PoolConfig::default()
            .with_max_threads(8)
            .with_min_threads(5),
    )
    .unwrap();
    assert_eq!(pool.stats().threads, 5);
    assert!(pool
        .set_config(
            PoolConfig::default()
                .with_max_threads(1)
                .with_min_threads(2)
        )
        .is_err());
}

fn blocker(release: &Arc<AtomicBool>) -> impl FnOnce() -> std::io::Result<usize> + Send + 'static {
    let release = release.clone();
    move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !release.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(1)
    }
}

/// A pool of one thread that runs `blocker` (token 0) until the flag is set: whatever is
/// submitted next stays queued.
fn one_thread_running_a_blocker() -> (ThreadPool, Arc<AtomicBool>) {
    let mut pool = ThreadPool::new(PoolConfig::default().with_max_threads(1)).unwrap();
    let release = Arc::new(AtomicBool::new(false));
    pool.submit_work(0, blocker(&release)).unwrap();
    // Wait until the blocker runs, so it cannot be cancelled (a deadline guards the hang).
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.stats().running == 0 {
        assert!(Instant::now() < deadline, "the blocker never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    (pool, release)
}

#[test]
fn cancel_removes_queued_work_only() {
    let (mut pool, release) = one_thread_running_a_blocker();
    let tmp = TempFile::with_len(4096, 1);
    let file = tmp.open(0).unwrap();
    pool.submit(Request::read(&file, 0, AlignedBuf::new(4096), 1))
        .unwrap();
    pool.submit_work(2, || Ok(2)).unwrap();
    assert!(!pool.cancel(0), "running work is not cancelled");
    assert!(pool.cancel(1));
    release.store(true, Ordering::SeqCst);
    let mut done = wait_for(&mut pool, 3);
    done.sort_by_key(|c| c.token);
    assert_eq!(done[0].result.as_ref().unwrap(), &1);
    assert_eq!(done[1].errno(), Some(libc::ECANCELED));
    assert_eq!(done[1].buf.count(), 1);
    assert_eq!(done[2].result.as_ref().unwrap(), &2);
}

#[test]
fn shutdown_cancels_queued_work_finishes_running_work_and_joins() {
    let (mut pool, release) = one_thread_running_a_blocker();
    for t in 1..6 {
        pool.submit_work(t, || Ok(7)).unwrap();
    }
    let r = release.clone();
    // The handshake: the pool's notifier becomes readable when `shutdown` has cancelled the
    // queued work (their completions are the first); only then is the blocker released, so
    // none of the five can have started. The deadline only guards a hang.
    let notifier = std::os::fd::AsRawFd::as_raw_fd(pool.notifier());
    let releaser = std::thread::spawn(move || {
        // The fd stays open while the pool (alive until this thread is joined) owns it.
        let ready = wait_readable(notifier, Duration::from_secs(30));
        r.store(true, Ordering::SeqCst);
        ready
    });
    let mut done = pool.shutdown();
    assert!(
        releaser.join().unwrap(),
        "shutdown never cancelled the queue"
    );
    done.sort_by_key(|c| c.token);
    assert_eq!(done.len(), 6);
    assert_eq!(
        done[0].result.as_ref().unwrap(),
        &1,
        "running work finished"
    );
    assert!(done[1..].iter().all(|c| c.errno() == Some(libc::ECANCELED)));
    assert_eq!(pool.stats().threads, 0, "every thread joined");
    assert!(matches!(
        pool.submit_work(9, || Ok(0)),
        Err(RequestError::ShutDown { .. })
    ));
    let tmp = TempFile::with_len(4096, 1);
    let e = pool
        .submit(Request::read(
            &tmp.open(0).unwrap(),
            0,
            AlignedBuf::new(4096),
            1,
        ))
        .unwrap_err();
    assert!(matches!(e.error, RequestError::ShutDown { .. }));
    assert_eq!(pool.in_flight(), 0);
}

#[test]
fn offloaded_closures_return_typed_results_in_the_loop() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let pool = ThreadPool::new(PoolConfig::default().with_max_threads(1)).unwrap();
    let pool = PoolContext::attach(&ctx, pool, |_, _| {}).unwrap();
    let results: Rc<RefCell<Vec<String>>> = Rc::default();
    let r = results.clone();
    let loop_thread = std::thread::current().id();
    pool.run(
        || (std::thread::current().name().map(String::from), 40 + 2),
        move |_ctx, v| {
            assert_eq!(
                std::thread::current().id(),
                loop_thread,
                "delivered on the loop thread"
            );
            let (name, n) = v.unwrap();
            r.borrow_mut().push(format!("{}:{n}", name.unwrap()));
        },
    )
    .unwrap();
    let r = results.clone();
    pool.run(
        || -> u32 { panic!("boom") },
        move |_ctx, v: std::io::Result<u32>| r.borrow_mut().push(format!("err:{}", v.unwrap_err())),
    )
    .unwrap();
    poll_until(&ctx, "two results", || results.borrow().len() == 2);
    assert_eq!(results.borrow()[0], "aio-pool:42");
    assert!(results.borrow()[1].contains("panicked"));

    // Cancel: occupy the only thread, queue one, cancel it.
    let release = Arc::new(AtomicBool::new(false));
    let rel = release.clone();
    let freed = Rc::new(Cell::new(false));
    let f = freed.clone();
    pool.run(
        move || {
            while !rel.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        },
        move |_, _| f.set(true),
    )
    .unwrap();
    while pool.with_pool(|p| p.stats().running) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let cancelled = Rc::new(Cell::new(None));
    let c = cancelled.clone();
    let token = pool
        .run(
            || 1,
            move |_, v: std::io::Result<i32>| c.set(v.err().and_then(|e| e.raw_os_error())),
        )
        .unwrap();
    assert!(token & WORK_TOKEN_BIT != 0);
    assert!(pool.cancel(token));
    release.store(true, Ordering::SeqCst);
    poll_until(&ctx, "cancel and release", || {
        freed.get() && cancelled.get().is_some()
    });
    assert_eq!(cancelled.get(), Some(libc::ECANCELED));
    assert_eq!(pool.in_flight(), 0);

    // I/O tokens may not use the work bit.
    let tmp = TempFile::with_len(4096, 1);
    let e = pool
        .submit(Request::read(
            &tmp.open(0).unwrap(),
            0,
            AlignedBuf::new(4096),
            WORK_TOKEN_BIT | 1,
        ))
        .unwrap_err();
    assert!(
        matches!(e.error, RequestError::ReservedToken { bit: 63, .. }),
        "{e}"
    );
}

#[test]
fn spinning_threads_take_the_next_job_without_a_spawn() {
    let mut pool =
        ThreadPool::new(PoolConfig::default().with_spin(Duration::from_millis(50))).unwrap();
    for t in 0..200 {
        pool.submit_work(t, move || Ok(t as usize)).unwrap();
        let done = wait_for(&mut pool, 1);
        assert_eq!(done[0].result.as_ref().unwrap(), &(t as usize));
    }
    // Not counting spinners as takers would spawn for nearly every job (none is idle while
    // it spins): up to the 64-thread maximum. A few spawns can still come from the moment
    // between a thread publishing its completion and starting to spin.
    assert!(
        pool.stats().spawned <= 8,
        "a spinning thread counts as taking the next job: {:?}",
        pool.stats()
    );
}

#[test]
fn fua_writes_are_counted() {
    let mut pool = ThreadPool::new(PoolConfig::default()).unwrap();
    let tmp = TempFile::with_len(8192, 0);
    let file = tmp.open(0).unwrap();
    let fua = Request::write(&file, 0, AlignedBuf::from_slice(&[4; 4096]), 1);
    pool.submit(fua.with_flags(RwFlags::FUA)).unwrap();
    pool.submit(Request::write(
        &file,
        4096,
        AlignedBuf::from_slice(&[5; 4096]),
        2,
    ))
    .unwrap();
    let done = wait_for(&mut pool, 2);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(pool.stats().fua_writes, 1);
    assert_eq!(tmp.contents()[..4096], [4; 4096]);
}

#[test]
fn run_async_gives_the_result_and_a_dropped_future_cancels_unstarted_work() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    // One thread, kept busy, so that the second piece of work waits in the queue.
    let pool = ThreadPool::new(PoolConfig::default().with_max_threads(1)).unwrap();
    let pool = PoolContext::attach(&ctx, pool, |_, _| {}).unwrap();
    assert_eq!(ctx.block_on(pool.run_async(|| 6 * 7)).unwrap(), 42);
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let busy = pool.run_async(move || {
        while !r.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        1
    });
    let ran = Arc::new(AtomicBool::new(false));
    let ran2 = ran.clone();
    let queued = pool.run_async(move || ran2.store(true, Ordering::Release));
    drop(queued);
    release.store(true, Ordering::Release);
    assert_eq!(ctx.block_on(busy).unwrap(), 1);
    poll_until(&ctx, "the cancelled work's completion", || {
        pool.in_flight() == 0
    });
    assert!(
        !ran.load(Ordering::Acquire),
        "cancelled before a thread started it"
    );
}

/// A dropped engine future whose request is still queued behind a busy worker is cancelled
/// there: it never runs (the file keeps its bytes), and the engine ends with nothing in flight.
#[test]
fn a_dropped_future_queued_behind_a_blocker_never_runs() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let pool = ThreadPool::new(PoolConfig::default().with_max_threads(1)).unwrap();
    let attached = ctx.attach_engine(pool, |_, _| {}).unwrap();
    // The one worker blocks until the gate opens.
    let (open_gate, gate) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    attached
        .with_engine(|p| {
            p.submit_work(1, move || {
                started_tx.send(()).unwrap();
                gate.recv().unwrap();
                Ok(0)
            })
        })
        .unwrap();
    started.recv().unwrap();
    let tmp = TempFile::with_len(4096, 7);
    let file = tmp.open(0).unwrap();
    let queued = attached.write(&file, 0, AlignedBuf::from_slice(&[9; 4096]));
    assert_eq!(attached.in_flight(), 2);
    drop(queued);
    open_gate.send(()).unwrap();
    poll_until(&ctx, "the blocker and the cancelled write", || {
        attached.in_flight() == 0
    });
    assert!(
        tmp.contents().iter().all(|&b| b == 7),
        "the cancelled write never ran"
    );
}
