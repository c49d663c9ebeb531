//! The [`ThreadPool`] engine: the handle the loop (or any owner) submits to. It runs every
//! op (reads and writes of owned buffers and of guest memory, syncs, discard and
//! write-zeroes, with FUA and NOWAIT), each with aio-core's blocking implementation.
//!
//! This module owns submission (validation, the plug batch of [`SubmitQueue`], handing jobs to
//! the threads and the spawn decision at that moment), collection of completions, cancel,
//! reconfiguration and shutdown. It never runs a job (`worker`) and never changes the idle
//! accounting except through [`State`]'s transitions (`state`).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use aio_core::engine::{Completion, IoEngine, Request, RequestError, RwFlags, SubmitError};
use aio_core::kit::SubmitQueue;
use aio_core::Notifier;

use crate::config::check;
use crate::{worker, Job, PoolConfig, PoolError, PoolStats, Shared, State};

/// The thread pool engine. See the [crate docs](crate).
///
/// `Send` (and `Sync`): the threads share an `Arc` of the queue; the handle may be built on one
/// thread and attached to a loop on another.
pub struct ThreadPool {
    shared: Arc<Shared>,
    queue: SubmitQueue,
    submitted: u64,
    returned: u64,
    fua_writes: u64,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
impl ThreadPool {
    /// A pool with `config`; `min_threads` threads start at once.
    pub fn new(config: PoolConfig) -> Result<Self, PoolError> {
        check(&config)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(config)),
            work: Condvar::new(),
            progress: Condvar::new(),
            jobs_len: AtomicUsize::new(0),
            done: Mutex::new(VecDeque::new()),
            done_len: AtomicUsize::new(0),
            signalled: AtomicBool::new(false),
            notifier: Notifier::new().map_err(PoolError::Notifier)?,
            notifier_writes: AtomicUsize::new(0),
        });
        let mut pool = ThreadPool {
            shared,
            queue: SubmitQueue::new(),
            submitted: 0,
            returned: 0,
            fua_writes: 0,
        };
        let mut st = pool.shared.lock();
        for _ in 0..config.min_threads {
            if let Err(e) = worker::spawn(&pool.shared, &mut st) {
                drop(st);
                // Stops and joins the threads already started.
                pool.shutdown();
                return Err(PoolError::Spawn(e));
            }
        }
        drop(st);
        Ok(pool)
    }

    /// Changes the limits at run time. Threads above a lowered maximum finish their current
    /// work and exit; a raised minimum spawns threads.
    pub fn set_config(&mut self, config: PoolConfig) -> Result<(), PoolError> {
        check(&config)?;
        let mut st = self.shared.lock();
        st.config = config;
        while st.threads < config.min_threads || st.needs_thread() {
            worker::spawn(&self.shared, &mut st).map_err(PoolError::Spawn)?;
        }
        drop(st);
        // Idle threads re-check their limits.
        self.shared.work.notify_all();
        Ok(())
    }

    /// The current limits.
    pub fn config(&self) -> PoolConfig {
        self.shared.lock().config
    }

    /// A snapshot of the pool's numbers.
    pub fn stats(&self) -> PoolStats {
        let st = self.shared.lock();
        PoolStats {
            threads: st.threads,
            idle: st.idle,
            peak_threads: st.peak,
            spawned: st.spawned,
            queued: st.jobs.len() + self.queue.len(),
            running: st.running,
            finished: st.finished,
            idle_timeouts: st.idle_timeouts,
            notifier_writes: self.shared.notifier_writes.load(Ordering::Relaxed) as u64,
            fua_writes: self.fua_writes,
        }
    }

    /// Queues offloaded work under `token`: `run` executes on a pool thread; its return value
    /// becomes the completion's `result` (no buffers). Use
    /// [`PoolContext::run`](crate::PoolContext::run) for typed results delivered to a closure.
    pub fn submit_work(
        &mut self,
        token: u64,
        run: impl FnOnce() -> io::Result<usize> + Send + 'static,
    ) -> Result<(), RequestError> {
        if self.shared.lock().shutdown {
            return Err(RequestError::ShutDown { engine: "pool" });
        }
        self.submitted += 1;
        self.enqueue(vec![Job::Work {
            token,
            run: Box::new(run),
        }]);
        Ok(())
    }

    /// Hands jobs to the threads, spawning where no idle, spinning or arriving thread will take
    /// them.
    fn enqueue(&mut self, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        let mut st = self.shared.lock();
        let n = jobs.len();
        st.jobs.extend(jobs);
        self.shared.jobs_len.store(st.jobs.len(), Ordering::Release);
        while st.needs_thread() {
            if let Err(e) = worker::spawn(&self.shared, &mut st) {
                if st.threads > 0 {
                    // The threads alive will get to the queue.
                    break;
                }
                // No thread at all: nothing would ever run the queue, so fail it.
                let failed: Vec<Job> = st.jobs.drain(..).collect();
                self.shared.jobs_len.store(0, Ordering::Release);
                st.finished += failed.len() as u64;
                drop(st);
                for job in failed {
                    let err = io::Error::new(e.kind(), format!("no pool thread could start: {e}"));
                    self.shared.finish(job.failed(err));
                }
                return;
            }
        }
        let wake = n.min(st.idle);
        drop(st);
        for _ in 0..wake {
            self.shared.work.notify_one();
        }
    }

    /// Sends what the queue lets go (everything unplugged; whole batches while plugged, sized
    /// by the work the threads already hold: the batch rule of [`SubmitQueue`]).
    fn flush(&mut self, force: bool) {
        loop {
            let batch: Vec<Job> = if force {
                self.queue.force_batch(usize::MAX).map(Job::Io).collect()
            } else {
                // Accepted, not returned and not queued here: with the threads.
                let with_threads =
                    ((self.submitted - self.returned) as usize).saturating_sub(self.queue.len());
                self.queue
                    .next_batch(usize::MAX, with_threads)
                    .map(Job::Io)
                    .collect()
            };
            if batch.is_empty() {
                return;
            }
            self.enqueue(batch);
        }
    }

    fn collect(&mut self, out: &mut VecDeque<Completion>) -> usize {
        if self.shared.done_len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut done = self
            .shared
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = done.len();
        out.extend(done.drain(..));
        self.shared.done_len.store(0, Ordering::Release);
        // The batch is taken: the next completion starts a new one and signals.
        self.shared.signalled.store(false, Ordering::Release);
        drop(done);
        self.returned += n as u64;
        n
    }

    /// Cancels queued work, waits for running work, joins every thread and returns every
    /// completion not yet collected. Later submissions are refused with
    /// [`RequestError::ShutDown`].
    pub fn shutdown(&mut self) -> Vec<Completion> {
        let mut out = VecDeque::new();
        let unsent = self.queue.cancel_all();
        self.shared.lock().finished += unsent.len() as u64;
        for c in unsent {
            self.shared.finish(c);
        }
        let handles = {
            let mut st = self.shared.lock();
            st.shutdown = true;
            let cancelled: Vec<Job> = st.jobs.drain(..).collect();
            self.shared.jobs_len.store(0, Ordering::Release);
            st.finished += cancelled.len() as u64;
            drop(st);
            for job in cancelled {
                self.shared.finish(job.cancelled());
            }
            self.shared.work.notify_all();
            let mut st = self.shared.lock();
            while st.threads > 0 {
                st = self.shared.wait_progress(st, None);
            }
            std::mem::take(&mut st.handles)
        };
        for h in handles {
            let _ = h.join();
        }
        self.collect(&mut out);
        out.into()
    }
}

impl IoEngine for ThreadPool {
    fn name(&self) -> &'static str {
        "pool"
    }

    fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
        if let Err(e) = request.validate() {
            return Err(SubmitError::new(e, request));
        }
        if self.shared.lock().shutdown {
            return Err(SubmitError::new(
                RequestError::ShutDown { engine: "pool" },
                request,
            ));
        }
        self.submitted += 1;
        self.fua_writes += request.flags.contains(RwFlags::FUA) as u64;
        self.queue.push(request);
        self.flush(false);
        Ok(())
    }

    fn plug(&mut self) {
        self.queue.plug();
    }

    fn unplug(&mut self) {
        if self.queue.unplug() {
            self.flush(false);
        }
    }

    fn set_max_batch(&mut self, max: usize) {
        self.queue.set_max_batch(max);
    }

    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        self.collect(out)
    }

    fn has_completions(&self) -> bool {
        self.shared.done_len.load(Ordering::Acquire) > 0
    }

    fn notifier(&self) -> &Notifier {
        &self.shared.notifier
    }

    fn cancel(&mut self, token: u64) -> bool {
        if let Some(c) = self.queue.cancel(token) {
            self.shared.lock().finished += 1;
            self.shared.finish(c);
            return true;
        }
        let mut st = self.shared.lock();
        let Some(pos) = st.jobs.iter().position(|j| j.token() == token) else {
            return false;
        };
        let job = st.jobs.remove(pos).expect("position is in range");
        self.shared.jobs_len.store(st.jobs.len(), Ordering::Release);
        st.finished += 1;
        drop(st);
        self.shared.finish(job.cancelled());
        true
    }

    fn in_flight(&self) -> usize {
        (self.submitted - self.returned) as usize
    }

    fn drain(&mut self) -> Vec<Completion> {
        self.flush(true);
        let mut out = VecDeque::new();
        loop {
            self.collect(&mut out);
            if self.in_flight() == 0 {
                return out.into();
            }
            let st = self.shared.lock();
            if self.shared.done_len.load(Ordering::Acquire) == 0 {
                drop(
                    self.shared
                        .wait_progress(st, Some(Duration::from_millis(50))),
                );
            }
        }
    }
}

impl Drop for ThreadPool {
    /// Cancels queued work and waits for running work and every thread: no buffer is freed
    /// while a thread may still use it.
    fn drop(&mut self) {
        drop(self.shutdown());
    }
}
