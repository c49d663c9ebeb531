//! The worker threads: waiting for jobs and the idle accounting; a job's syscalls are
//! aio-core's [`run_blocking`], shared with every engine that needs a blocking path.
//!
//! This module owns what runs on a pool thread. It touches the shared state only under its
//! lock, counts a thread as idle exactly while it waits on the condition variable (QEMU's
//! thread-pool idle-thread accounting), and owns a job's buffers while it runs it, so nothing
//! else can see them meanwhile.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Instant;

use aio_core::kit::run_blocking;

use crate::{Job, Shared, State};

/// Starts one worker. Called with the state locked; counts it as arriving until it reaches
/// the queue.
pub(crate) fn spawn(shared: &Arc<Shared>, st: &mut MutexGuard<'_, State>) -> io::Result<()> {
    st.handles.retain(|h| !h.is_finished());
    let s = shared.clone();
    // Counted before the thread exists, so that it cannot reach `arrived` first.
    st.reserve_thread();
    match std::thread::Builder::new()
        .name("aio-pool".into())
        .spawn(move || run(&s))
    {
        Ok(handle) => {
            st.handles.push(handle);
            st.thread_started();
            Ok(())
        }
        Err(e) => {
            st.unreserve_thread();
            Err(e)
        }
    }
}

fn run(shared: &Shared) {
    let mut st = shared.lock();
    st.arrived();
    // Whether this idle period already spun (spin once, then sleep).
    let mut spun = false;
    loop {
        if let Some(job) = st.take_job() {
            spun = false;
            shared.jobs_len.store(st.jobs.len(), Ordering::Release);
            drop(st);
            let completion = execute(job);
            // This thread is busy until it waits again: a request submitted meanwhile sees no
            // idle thread and may spawn one (QEMU's idle-thread accounting). On VMs that extra
            // thread is also what keeps a QD1 round trip from paying a cross-vCPU wake-up every
            // time.
            shared.finish(completion);
            st = shared.lock();
            st.job_done();
            shared.notify_progress(&st);
            continue;
        }
        if st.must_exit() {
            break;
        }
        let spin = st.config.spin;
        if !spin.is_zero() && !spun {
            // Busy-wait a little for the next job before paying for a sleep and a wake-up.
            // A spinning thread is not idle (it is not waiting on the condvar), but it will
            // take the next job, so submitters count it and do not spawn for that job.
            st.spinning += 1;
            drop(st);
            let deadline = Instant::now() + spin;
            // Yielding, not pausing: the thread that submits the next job may share this
            // CPU (a loop and the pool it started, pinned together), and must get to run.
            // With nothing else runnable here, `sched_yield` returns at once.
            while shared.jobs_len.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                std::thread::yield_now();
            }
            st = shared.lock();
            st.spinning -= 1;
            spun = true;
            // Re-check jobs and shutdown at the top: a notify_all sent while we spun did
            // not reach us.
            continue;
        }
        // Idle only while waiting: a thread that has work is never counted idle.
        st.idle_begin();
        let timeout = st.config.idle_timeout;
        let (guard, result) = shared
            .work
            .wait_timeout(st, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        st = guard;
        if st.idle_end(result.timed_out()) {
            break;
        }
    }
    st.retire();
    shared.notify_progress(&st);
}

fn execute(job: Job) -> aio_core::engine::Completion {
    match job {
        Job::Io(mut request) => {
            // A panic in the I/O path (a bug: no request should reach one) must not lose the
            // request: it completes with an error, and the thread goes on. The syscalls are
            // synchronous, so nothing the kernel could still write outlives the unwind.
            let result = catch_unwind(AssertUnwindSafe(|| run_blocking(&mut request)))
                .unwrap_or_else(|_| Err(io::Error::other("the pool's I/O path panicked")));
            request.complete(result)
        }
        Job::Work { token, run } => {
            let result = catch_unwind(AssertUnwindSafe(run))
                .unwrap_or_else(|_| Err(io::Error::other("offloaded work panicked")));
            aio_core::engine::Completion {
                token,
                result,
                buf: Default::default(),
            }
        }
    }
}
