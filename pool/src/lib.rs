//! # aio-pool
//!
//! QEMU's `aio=threads`: a thread pool that is an [`IoEngine`] (blocking `preadv` / `pwritev` /
//! `fsync` / `fdatasync` in worker threads) and a general offload for any blocking closure whose
//! result comes back in the loop ([`PoolContext::run`], QEMU's "threadlets"; handing work to a
//! thread pool has a fixed cost, which `benches/pool.rs` measures).
//!
//! * **Threads** ([`PoolConfig`], QEMU's defaults): at most 64, at least 0, a thread above the
//!   minimum exits after 10 s without work; all settable, also at run time
//!   ([`ThreadPool::set_config`]). A thread is spawned when work is queued that no idle,
//!   spinning or just-spawned thread will take and fewer than the maximum run. A thread counts
//!   as idle only while it waits for work (QEMU's thread-pool idle-thread accounting: counting
//!   busy threads as idle starves the pool).
//! * **Completions** are signalled through a [`Notifier`] (written once per batch of
//!   completions, not once per completion) plus a syscall-free `has_completions` check that
//!   adaptive polling uses (QEMU's thread-pool notifier/io_poll change: QD1 69.87 -> 49.45 µs).
//! * **Cancel** removes work that no thread has started; it completes with `ECANCELED`.
//! * **Shutdown** ([`ThreadPool::shutdown`], or drop) cancels queued work, lets running work
//!   finish, joins every thread, and only then frees buffers.
//!
//! ```
//! use aio_backend_poll::PollLoop;
//! use aio_core::AioContext;
//! use aio_pool::{PoolConfig, PoolContext, ThreadPool};
//! use std::cell::Cell;
//! use std::rc::Rc;
//!
//! let ctx = AioContext::new(PollLoop::new()).unwrap();
//! let pool = ThreadPool::new(PoolConfig::default()).unwrap();
//! let pool = PoolContext::attach(&ctx, pool, |_ctx, _completion| {}).unwrap();
//! let answer = Rc::new(Cell::new(0));
//! let a = answer.clone();
//! pool.run(|| 6 * 7, move |_ctx, v| a.set(v.unwrap())).unwrap();
//! while answer.get() == 0 {
//!     ctx.poll(true);
//! }
//! assert_eq!(answer.get(), 42);
//! ```

#[cfg(all(test, aio_loom))]
mod loom_model;
mod offload;
mod worker;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use aio_core::backend::SubmitQueue;
use aio_core::engine::{Completion, IoEngine, Request, RequestError, SubmitError};
use aio_core::Notifier;

pub use offload::{PoolContext, WORK_TOKEN_BIT};

/// Thread limits (QEMU's `thread-pool-min`, `thread-pool-max`, and its 10 s idle timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Most threads at once (QEMU: 64).
    pub max_threads: usize,
    /// Threads kept even when idle (QEMU: 0).
    pub min_threads: usize,
    /// How long a thread above the minimum waits for work before it exits (QEMU: 10 s).
    pub idle_timeout: Duration,
    /// How long a thread that finished its work busy-waits for more before it sleeps (0, the
    /// default, as QEMU). At queue depth 1 the next request usually arrives within a few µs;
    /// spinning saves the cross-thread wake-up (about 20 µs on a VM) at the cost of CPU.
    pub spin: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_threads: 64,
            min_threads: 0,
            idle_timeout: Duration::from_secs(10),
            spin: Duration::ZERO,
        }
    }
}

/// An error creating or configuring a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Limits that cannot hold.
    #[error("invalid pool limits: max_threads {max} must be >= 1 and >= min_threads {min}")]
    InvalidLimits {
        /// max_threads given.
        max: usize,
        /// min_threads given.
        min: usize,
    },
    /// The completion notifier could not be created.
    #[error("creating the pool's completion notifier failed: {0}")]
    Notifier(#[source] io::Error),
    /// A worker thread could not be spawned.
    #[error("spawning a pool thread failed: {0}")]
    Spawn(#[source] io::Error),
}

impl From<PoolError> for io::Error {
    fn from(e: PoolError) -> io::Error {
        let kind = match &e {
            PoolError::InvalidLimits { .. } => io::ErrorKind::InvalidInput,
            PoolError::Notifier(s) | PoolError::Spawn(s) => s.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// What the pool is doing, as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Threads alive.
    pub threads: usize,
    /// Threads waiting for work right now.
    pub idle: usize,
    /// The most threads alive at once.
    pub peak_threads: usize,
    /// Threads spawned in all.
    pub spawned: u64,
    /// Work queued and not started (in the pool's queue and in an open plug batch).
    pub queued: usize,
    /// Work running in a thread right now.
    pub running: usize,
    /// Work finished (completed, failed or cancelled) in all.
    pub finished: u64,
    /// Notifier writes (at most one per batch of completions).
    pub notifier_writes: u64,
}

/// A unit of work for a thread.
pub(crate) enum Job {
    /// A block I/O request.
    Io(Request),
    /// Offloaded work: the closure stores its own result; the completion carries only the token.
    Work {
        token: u64,
        run: Box<dyn FnOnce() -> io::Result<usize> + Send>,
    },
}

impl Job {
    fn token(&self) -> u64 {
        match self {
            Job::Io(r) => r.token,
            Job::Work { token, .. } => *token,
        }
    }

    fn cancelled(self) -> Completion {
        self.failed(io::Error::from_raw_os_error(libc::ECANCELED))
    }

    fn failed(self, err: io::Error) -> Completion {
        match self {
            Job::Io(r) => r.complete(Err(err)),
            Job::Work { token, .. } => Completion {
                token,
                result: Err(err),
                buf: Default::default(),
            },
        }
    }
}

pub(crate) struct State {
    pub(crate) jobs: VecDeque<Job>,
    pub(crate) config: PoolConfig,
    pub(crate) threads: usize,
    pub(crate) idle: usize,
    /// Spawned threads that have not reached the job queue yet: each will take a job.
    pub(crate) arriving: usize,
    /// Threads busy-waiting for work (`PoolConfig::spin`): each will take a job.
    pub(crate) spinning: usize,
    pub(crate) running: usize,
    pub(crate) peak: usize,
    pub(crate) spawned: u64,
    pub(crate) finished: u64,
    pub(crate) shutdown: bool,
    pub(crate) handles: Vec<JoinHandle<()>>,
}

impl State {
    /// No threads, no jobs.
    pub(crate) fn new(config: PoolConfig) -> State {
        State {
            jobs: VecDeque::new(),
            config,
            threads: 0,
            idle: 0,
            arriving: 0,
            spinning: 0,
            running: 0,
            peak: 0,
            spawned: 0,
            finished: 0,
            shutdown: false,
            handles: Vec::new(),
        }
    }

    /// The spawn rule (QEMU's, with its idle-thread accounting): queued work outnumbers the
    /// threads that will take it (idle = waiting, spinning, or spawned and not yet at the
    /// queue) and the maximum allows another thread.
    pub(crate) fn needs_thread(&self) -> bool {
        self.jobs.len() > self.idle + self.arriving + self.spinning
            && self.threads < self.config.max_threads
    }

    // The transitions of the idle accounting, in the order a thread goes through them. The
    // worker loop (`worker::run`) and the loom model (`loom_model`) both use exactly these.

    /// Counts a thread about to be started: it is arriving until it reaches the queue.
    pub(crate) fn reserve_thread(&mut self) {
        self.threads += 1;
        self.arriving += 1;
    }

    /// Undoes [`reserve_thread`](Self::reserve_thread) when the thread could not be started.
    pub(crate) fn unreserve_thread(&mut self) {
        self.threads -= 1;
        self.arriving -= 1;
    }

    /// The reserved thread was started.
    pub(crate) fn thread_started(&mut self) {
        self.spawned += 1;
        self.peak = self.peak.max(self.threads);
    }

    /// A started thread reached the queue.
    pub(crate) fn arrived(&mut self) {
        self.arriving -= 1;
    }

    /// Takes the next job; the thread counts as running until [`job_done`](Self::job_done).
    pub(crate) fn take_job(&mut self) -> Option<Job> {
        let job = self.jobs.pop_front()?;
        self.running += 1;
        Some(job)
    }

    /// The thread finished a job.
    pub(crate) fn job_done(&mut self) {
        self.running -= 1;
        self.finished += 1;
    }

    /// With no job to take: whether the thread must exit (shutdown, or above the maximum).
    pub(crate) fn must_exit(&self) -> bool {
        self.shutdown || self.threads > self.config.max_threads
    }

    /// The thread is about to wait for work: idle exactly while it waits (as QEMU counts).
    pub(crate) fn idle_begin(&mut self) {
        self.idle += 1;
    }

    /// The thread is back from its wait; returns whether it retires (its wait timed out, no
    /// job is queued, and more than the minimum of threads are left).
    pub(crate) fn idle_end(&mut self, timed_out: bool) -> bool {
        self.idle -= 1;
        timed_out && self.jobs.is_empty() && self.threads > self.config.min_threads
    }

    /// The thread exits.
    pub(crate) fn retire(&mut self) {
        self.threads -= 1;
    }
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Workers wait here for jobs.
    pub(crate) work: Condvar,
    /// `drain`/shutdown wait here for jobs to finish and threads to exit.
    pub(crate) progress: Condvar,
    /// `jobs.len()`, readable without the lock by spinning threads.
    pub(crate) jobs_len: AtomicUsize,
    pub(crate) done: Mutex<VecDeque<Completion>>,
    pub(crate) done_len: AtomicUsize,
    /// Set once completions have been signalled and not yet collected: later completions
    /// of the same batch skip the notifier write.
    pub(crate) signalled: AtomicBool,
    pub(crate) notifier: Notifier,
    pub(crate) notifier_writes: AtomicUsize,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes a finished job and wakes the loop if this starts a new batch.
    ///
    /// The queue, its length and the batch flag change together under the `done` lock, so a
    /// completion published after the loop took a batch always writes the notifier.
    pub(crate) fn finish(&self, completion: Completion) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        done.push_back(completion);
        self.done_len.store(done.len(), Ordering::Release);
        let first_of_batch = !self.signalled.swap(true, Ordering::AcqRel);
        drop(done);
        if first_of_batch {
            self.notifier_writes.fetch_add(1, Ordering::Relaxed);
            let _ = self.notifier.notify();
        }
    }
}

/// The thread pool engine. See the [crate docs](crate).
pub struct ThreadPool {
    shared: Arc<Shared>,
    queue: SubmitQueue,
    submitted: u64,
    returned: u64,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn check(config: &PoolConfig) -> Result<(), PoolError> {
    if config.max_threads == 0 || config.min_threads > config.max_threads {
        return Err(PoolError::InvalidLimits {
            max: config.max_threads,
            min: config.min_threads,
        });
    }
    Ok(())
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
            notifier_writes: self.shared.notifier_writes.load(Ordering::Relaxed) as u64,
        }
    }

    /// Queues offloaded work under `token`: `run` executes on a pool thread; its return value
    /// becomes the completion's `result` (no buffers). Use [`PoolContext::run`] for typed
    /// results delivered to a closure.
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
                st = self
                    .shared
                    .progress
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
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
                let _ = self
                    .shared
                    .progress
                    .wait_timeout(st, Duration::from_millis(50))
                    .unwrap_or_else(PoisonError::into_inner);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_limits_are_typed_errors() {
        let e = ThreadPool::new(PoolConfig {
            max_threads: 0,
            ..PoolConfig::default()
        })
        .unwrap_err();
        assert!(matches!(e, PoolError::InvalidLimits { max: 0, .. }));
        let e = ThreadPool::new(PoolConfig {
            max_threads: 2,
            min_threads: 3,
            ..PoolConfig::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("min_threads 3"));
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
    }
}
