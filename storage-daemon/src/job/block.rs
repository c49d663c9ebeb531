//! What a block job adds to a job (QEMU's `blockjob.c`): a speed limit, the pause points and
//! waits its work runs through on its own thread, its kind's end at finalization, and the
//! `BLOCK_JOB_*` events.
//!
//! This module owns those waits and the speed limit; the lifecycle and the events are the table's
//! (`table.rs`), a kind's work its own (a backup's is `aio_block::backup`).
//!
//! * **A pause point** ([`JobHandle::checkpoint`]) is where a job the user paused shows
//!   `paused` and waits (QEMU's `job_pause_point`), and where a cancel is seen.
//! * **The speed limit** ([`JobHandle::throttle`]) delays the work after the bytes it did, as
//!   QEMU's `block_job_ratelimit_processed`; a new speed or a cancel wakes it.
//! * **Every wait is woken** by the verbs that may end it (cancel, resume, a new speed), never
//!   by polling.

use std::time::{Duration, Instant};

use super::status::JobStatus;
use super::table::{Finalizer, JobError, JobHandle, Jobs, Table};

impl Jobs {
    /// `block-job-set-speed`: block job `id`'s limit, counted afresh from now.
    pub fn set_speed(&self, id: &str, speed: u64) -> Result<(), JobError> {
        let mut table = self.lock();
        let job = table
            .jobs
            .iter_mut()
            .find(|j| j.info.id == id && j.info.kind.is_block_job())
            .ok_or_else(|| JobError::NoBlockJob(id.to_string()))?;
        job.info.speed = speed;
        job.rate = (Instant::now(), 0);
        self.wake.notify_all();
        Ok(())
    }

    /// QEMU's op blocker: node `node` is used by a job that was not dismissed yet.
    pub fn check_node_free(&self, node: &str) -> Result<(), JobError> {
        let table = self.lock();
        match table
            .jobs
            .iter()
            .find(|j| j.nodes.iter().any(|n| n == node))
        {
            Some(job) => Err(JobError::NodeBusy {
                node: node.to_string(),
                kind: job.info.kind.name(),
            }),
            None => Ok(()),
        }
    }

    /// Whether `id` is a block job's (the `block-job-*` verbs' lookup, QEMU's text).
    pub fn check_block_job(&self, id: &str) -> Result<(), JobError> {
        let table = self.lock();
        match table
            .jobs
            .iter()
            .any(|j| j.info.id == id && j.info.kind.is_block_job())
        {
            true => Ok(()),
            false => Err(JobError::NoBlockJob(id.to_string())),
        }
    }
}

impl JobHandle {
    /// Sets what the job's kind does when it is finalized (`true`) or aborted (`false`).
    pub fn set_finalizer(&self, finalize: Finalizer) {
        self.with(|_, table, at| table.jobs[at].finalizer = Some(finalize));
    }

    /// Makes `nodes` busy for other jobs until this one is dismissed.
    pub fn use_nodes(&self, nodes: Vec<String>) {
        self.with(|_, table, at| table.jobs[at].nodes = nodes);
    }

    /// Sets the speed limit the job starts with.
    pub fn set_speed(&self, speed: u64) {
        self.with(|_, table, at| {
            table.jobs[at].info.speed = speed;
            table.jobs[at].rate = (Instant::now(), 0);
        });
    }

    /// Runs `f` with the job shown `paused` (QEMU pauses a new job while its node is
    /// quiesced to insert its filter): `running`, `paused`, `running` again.
    pub fn quiesced<T>(&self, f: impl FnOnce() -> T) -> T {
        self.with(|jobs, table, at| jobs.transition(&mut table.jobs[at], JobStatus::Paused));
        let out = f();
        self.with(|jobs, table, at| jobs.transition(&mut table.jobs[at], JobStatus::Running));
        out
    }

    /// Waits on the table's wake-up, at most `timeout` (None: until woken).
    fn wait<'a>(
        &self,
        table: std::sync::MutexGuard<'a, Table>,
        timeout: Option<Duration>,
    ) -> std::sync::MutexGuard<'a, Table> {
        use std::sync::PoisonError;
        match timeout {
            None => (self.jobs.wake.wait(table)).unwrap_or_else(PoisonError::into_inner),
            Some(t) => {
                let waited = self.jobs.wake.wait_timeout(table, t);
                waited.unwrap_or_else(PoisonError::into_inner).0
            }
        }
    }

    /// A pause point: while the user has the job paused it shows `paused` and waits; true
    /// when it is cancelled (or gone), and the work stops.
    pub fn checkpoint(&self) -> bool {
        let mut table = self.jobs.lock();
        loop {
            let Some(job) = table.jobs.iter_mut().find(|j| j.serial == self.serial) else {
                return true;
            };
            if job.cancelled {
                return true;
            }
            if !self.follow_pause(job) {
                return false;
            }
            table = self.wait(table, None);
        }
    }

    /// Waits until the job is cancelled (or gone), shown `paused` while the user pauses it.
    pub fn wait_for_cancel(&self) {
        let mut table = self.jobs.lock();
        loop {
            let Some(job) = table.jobs.iter_mut().find(|j| j.serial == self.serial) else {
                return;
            };
            if job.cancelled {
                return;
            }
            self.follow_pause(job);
            table = self.wait(table, None);
        }
    }

    /// Shows `job` paused while the user pauses it and running again once resumed; whether it
    /// is paused.
    fn follow_pause(&self, job: &mut super::table::Job) -> bool {
        match (job.info.user_paused, job.info.status) {
            (true, JobStatus::Running) => self.jobs.transition(job, JobStatus::Paused),
            (false, JobStatus::Paused) => self.jobs.transition(job, JobStatus::Running),
            _ => {}
        }
        job.info.user_paused
    }

    /// Counts `bytes` done against the speed limit and waits as long as the limit asks
    /// (woken early by a cancel; a new speed counts afresh).
    pub fn throttle(&self, bytes: u64) {
        let mut table = self.jobs.lock();
        if let Some(job) = table.jobs.iter_mut().find(|j| j.serial == self.serial) {
            job.rate.1 += bytes;
        }
        loop {
            let Some(job) = table.jobs.iter().find(|j| j.serial == self.serial) else {
                return;
            };
            if job.cancelled || job.info.speed == 0 {
                return;
            }
            let (since, counted) = job.rate;
            let due = since + Duration::from_secs_f64(counted as f64 / job.info.speed as f64);
            let now = Instant::now();
            if now >= due {
                return;
            }
            table = self.wait(table, Some(due - now));
        }
    }
}
