//! The loom model of the pool's idle accounting and spawn decision (QEMU's thread-pool
//! idle-thread accounting), built with `--cfg aio_loom` (scripts/loom.sh).
//!
//! The model runs the real [`State`] transitions (`reserve_thread`, `thread_started`,
//! `arrived`, `take_job`, `job_done`, `must_exit`, `idle_begin`, `idle_end`, `retire`) and the
//! real spawn rule (`needs_thread`), with loom's mutex, condition variable and threads in place
//! of std's, so loom explores every interleaving of submitters, workers, idle timeouts and
//! shutdown. The worker loop itself is a copy of `worker::run`'s sleeping path (without
//! `PoolConfig::spin`, off by default), so the model checks the accounting and the decision,
//! not where the real loop calls them. What it cannot run is the I/O (jobs here count their
//! runs) and real time (an idle timeout is a thread that fires it at any point).

use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use crate::{Job, PoolConfig, State};

struct Model {
    state: Mutex<State>,
    work: Condvar,
    progress: Condvar,
    /// Set by the "timer": the next wait that ends counts as timed out.
    timeout_fired: AtomicBool,
    runs: AtomicUsize,
    /// Threads really blocked in `work.wait` (changed only under the state lock): what
    /// `State::idle` must equal whenever a submitter looks (QEMU's idle-thread accounting).
    waiting: AtomicUsize,
}

/// `worker::run`, with the job's I/O replaced by a count.
fn worker(m: Arc<Model>) {
    let mut st = m.state.lock().unwrap();
    st.arrived();
    loop {
        if let Some(job) = st.take_job() {
            drop(st);
            if let Job::Work { run, .. } = job {
                let _ = run();
            }
            st = m.state.lock().unwrap();
            st.job_done();
            m.progress.notify_all();
            continue;
        }
        if st.must_exit() {
            break;
        }
        st.idle_begin();
        m.waiting.fetch_add(1, Ordering::Relaxed);
        st = m.work.wait(st).unwrap();
        m.waiting.fetch_sub(1, Ordering::Relaxed);
        let timed_out = m.timeout_fired.swap(false, Ordering::AcqRel);
        if st.idle_end(timed_out) {
            break;
        }
    }
    st.retire();
    m.progress.notify_all();
}

/// `ThreadPool::enqueue` for one job: queue it, spawn by the rule, wake idle threads.
fn submit(m: &Arc<Model>, handles: &mut Vec<thread::JoinHandle<()>>) {
    let runs = m.clone();
    let job = Job::Work {
        token: 0,
        run: Box::new(move || {
            runs.runs.fetch_add(1, Ordering::AcqRel);
            Ok(0)
        }),
    };
    let mut st = m.state.lock().unwrap();
    assert_eq!(
        st.idle,
        m.waiting.load(Ordering::Relaxed),
        "threads counted idle are exactly those waiting for work"
    );
    st.jobs.push_back(job);
    while st.needs_thread() {
        st.reserve_thread();
        let w = m.clone();
        handles.push(thread::spawn(move || worker(w)));
        st.thread_started();
    }
    // The rule's promise: what is queued has a thread that will take it (or the pool is full).
    assert!(
        st.jobs.len() <= st.idle + st.arriving + st.spinning || st.threads == st.config.max_threads,
        "a job is queued that no thread will take"
    );
    assert!(st.threads <= st.config.max_threads);
    let wake = st.idle.min(1);
    drop(st);
    for _ in 0..wake {
        m.work.notify_one();
    }
}

fn model(max_threads: usize, jobs: usize, with_timeout: bool) {
    loom::model(move || {
        let mut config = PoolConfig {
            max_threads,
            min_threads: 0,
            ..PoolConfig::default()
        };
        config.idle_timeout = Duration::from_secs(10);
        let m = Arc::new(Model {
            state: Mutex::new(State::new(config)),
            work: Condvar::new(),
            progress: Condvar::new(),
            timeout_fired: AtomicBool::new(false),
            runs: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        });
        let mut handles = Vec::new();
        let timer = with_timeout.then(|| {
            let m = m.clone();
            thread::spawn(move || {
                m.timeout_fired.store(true, Ordering::Release);
                // A timed-out wait ends by itself; here a notify stands in for the clock.
                let _guard = m.state.lock().unwrap();
                m.work.notify_all();
            })
        });
        for _ in 0..jobs {
            submit(&m, &mut handles);
        }
        // drain(): wait until every job finished.
        let mut st = m.state.lock().unwrap();
        while st.finished < jobs as u64 {
            st = m.progress.wait(st).unwrap();
        }
        assert!(st.idle + st.running + st.arriving <= st.threads);
        // shutdown(): wake everyone and join.
        st.shutdown = true;
        drop(st);
        m.work.notify_all();
        for h in handles {
            h.join().unwrap();
        }
        if let Some(t) = timer {
            t.join().unwrap();
        }
        let st = m.state.lock().unwrap();
        assert_eq!(
            m.runs.load(Ordering::Acquire),
            jobs,
            "every job ran exactly once"
        );
        assert_eq!(
            (st.threads, st.idle, st.arriving, st.running),
            (0, 0, 0, 0),
            "the accounting returns to zero"
        );
        assert!(st.peak <= max_threads);
    });
}

#[test]
fn two_jobs_two_threads_every_job_runs_once() {
    model(2, 2, false);
}

#[test]
fn one_thread_serves_two_jobs() {
    model(1, 2, false);
}

#[test]
fn an_idle_timeout_racing_a_submission_strands_nothing() {
    model(1, 2, true);
}
