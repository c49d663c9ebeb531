//! The state the pool's threads share: the job queue, the idle accounting and the completion
//! queue.
//!
//! This module owns [`State`] (the counts and the transitions a thread goes through, which the
//! workers and the loom model both run) and [`Shared`] (the locks, condition variables and the
//! completion notifier around it). It never spawns or runs a thread (`worker`) and never decides
//! what is submitted when (`engine`).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use aio_core::engine::{Completion, Request};
use aio_core::Notifier;

use crate::PoolConfig;

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
    pub(crate) fn token(&self) -> u64 {
        match self {
            Job::Io(r) => r.token,
            Job::Work { token, .. } => *token,
        }
    }

    pub(crate) fn cancelled(self) -> Completion {
        self.failed(io::Error::from_raw_os_error(libc::ECANCELED))
    }

    pub(crate) fn failed(self, err: io::Error) -> Completion {
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
    /// Threads waiting on `Shared::progress` (`drain`, shutdown): a worker notifies it only
    /// when one does, so a request does not pay a futex wake that nobody waits for.
    pub(crate) progress_waiters: usize,
    pub(crate) peak: usize,
    pub(crate) spawned: u64,
    pub(crate) finished: u64,
    /// Idle waits that timed out (a thread retires on one only above the minimum).
    pub(crate) idle_timeouts: u64,
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
            progress_waiters: 0,
            peak: 0,
            spawned: 0,
            finished: 0,
            idle_timeouts: 0,
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
        self.idle_timeouts += u64::from(timed_out);
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
    /// Wakes the threads waiting for progress, if any (called with the state locked, so a
    /// waiter counted in `st` is in its wait or about to release the lock into it).
    pub(crate) fn notify_progress(&self, st: &State) {
        if st.progress_waiters > 0 {
            self.progress.notify_all();
        }
    }

    /// Waits on `progress` (at most `timeout`), counted in `progress_waiters` meanwhile.
    pub(crate) fn wait_progress<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, State> {
        st.progress_waiters += 1;
        let mut st = match timeout {
            Some(t) => {
                self.progress
                    .wait_timeout(st, t)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => self
                .progress
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner),
        };
        st.progress_waiters -= 1;
        st
    }

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
