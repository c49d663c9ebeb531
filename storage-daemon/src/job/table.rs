//! The daemon's jobs: each one's id, type, state, progress and error, the verbs applied to
//! them, and every state change announced as QEMU's `JOB_STATUS_CHANGE`.
//!
//! This module owns the table and the lifecycle QEMU's `job.c` gives a job once its work is
//! done (`waiting`, `pending`, finalized, `concluded`, dismissed; or `aborting` on an
//! error or a cancel); never a job's work, which its kind runs on a thread of its own and
//! reports through its [`JobHandle`], nor QMP (the monitor's `jobs` module).
//!
//! * Jobs are listed newest first, as QEMU's job list is (new jobs go to its head).
//! * Every state change goes through [`JobStatus::may_become`] and is sent on the daemon's
//!   event queue while the table is locked, so the events' order is the changes' order.
//! * `job-pause` of a running job counts a pause as QEMU does; a job pauses only where its
//!   work checks for one, and a job without such points (a create job) never shows `paused`.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde_json::json;

use super::status::{JobStatus, JobVerb, VerbRefused};
use crate::daemon::{Event, EventQueue};

/// A job's type, QEMU's `JobType` (its QMP name by [`JobType::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobType {
    /// `blockdev-create`.
    Create,
    /// `blockdev-backup`.
    Backup,
}

impl JobType {
    /// QEMU's name.
    pub fn name(self) -> &'static str {
        match self {
            JobType::Create => "create",
            JobType::Backup => "backup",
        }
    }

    /// Whether jobs of this type are block jobs (listed by `query-block-jobs`).
    pub fn is_block_job(self) -> bool {
        match self {
            JobType::Create => false,
            JobType::Backup => true,
        }
    }
}

/// Why a job could not be made or a verb applied: QEMU's texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// No job has the id.
    #[error("Job not found")]
    NotFound,
    /// The id is not one QEMU accepts (a letter, then letters, digits, `-`, `.`, `_`).
    #[error("Invalid job ID '{0}'")]
    InvalidId(String),
    /// A job has the id already.
    #[error("Job ID '{0}' already in use")]
    InUse(String),
    /// The job's state does not accept the verb.
    #[error(transparent)]
    Refused(#[from] VerbRefused),
    /// `job-pause` of a job the user paused already.
    #[error("Job is already paused")]
    AlreadyPaused,
    /// `job-resume` of a job the user did not pause.
    #[error("Can't resume a job that was not paused")]
    NotPaused,
    /// A node another job uses.
    #[error("Node '{node}' is busy: block device is in use by block job: {kind}")]
    NodeBusy {
        /// The node.
        node: String,
        /// The using job's type.
        kind: &'static str,
    },
    /// A `block-job-*` verb naming no block job.
    #[error("Block job '{0}' not found")]
    NoBlockJob(String),
    /// `job-complete` of a job that has no completion (or is being cancelled).
    #[error("The active block job '{0}' cannot be completed")]
    CannotComplete(String),
}

/// What `query-jobs` says of a job (QEMU's `JobInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The id.
    pub id: String,
    /// The type.
    pub kind: JobType,
    /// The state.
    pub status: JobStatus,
    /// Work done, in the job's units.
    pub current: u64,
    /// Work done and to do.
    pub total: u64,
    /// The error it failed with.
    pub error: Option<String>,
    /// Its speed limit in bytes per second (0: none; block jobs).
    pub speed: u64,
    /// QEMU's `auto-finalize` and `auto-dismiss`.
    pub flags: JobFlags,
    /// The user paused it and did not resume it yet.
    pub user_paused: bool,
}

/// QEMU's job flags for a kind of job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFlags {
    /// Finalized as soon as it is pending (no `job-finalize` needed).
    pub auto_finalize: bool,
    /// Gone as soon as it concluded (no `job-dismiss` needed).
    pub auto_dismiss: bool,
}

/// What a job's kind does when the job is finalized or aborted (a backup's bitmap and
/// filter): told whether it succeeded, run with the table locked (it must not call back).
pub type Finalizer = Box<dyn FnOnce(bool) + Send>;

pub(super) struct Job {
    pub(super) info: JobInfo,
    /// Which job this is (ids are reused once a job is dismissed; serials never).
    pub(super) serial: u64,
    /// A cancel was asked.
    pub(super) cancelled: bool,
    /// The kind's end, run once.
    pub(super) finalizer: Option<Finalizer>,
    /// Since when the speed limit counts, and the bytes counted since.
    pub(super) rate: (Instant, u64),
    /// The block nodes it uses: busy for other jobs until it is dismissed (QEMU's op
    /// blockers, freed with the job).
    pub(super) nodes: Vec<String>,
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) jobs: Vec<Job>,
    serials: u64,
}

/// The daemon's jobs: `Send + Sync + Clone`, shared by the monitor and the jobs' threads.
#[derive(Clone, Default)]
pub struct Jobs {
    table: Arc<Mutex<Table>>,
    /// Told whenever a verb may let a waiting job go on (cancel, resume, a new speed).
    pub(super) wake: Arc<Condvar>,
    events: EventQueue,
}

/// What a running job holds to report its progress and its end (a clone reports for the
/// same job; the first end counts).
#[derive(Clone)]
pub struct JobHandle {
    pub(super) jobs: Jobs,
    pub(super) serial: u64,
}

/// Whether `id` is one QEMU accepts (its `id_wellformed`).
pub fn id_wellformed(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

impl Jobs {
    /// No jobs; their changes announced on `events`.
    pub fn new(events: EventQueue) -> Jobs {
        Jobs {
            table: Arc::default(),
            wake: Arc::default(),
            events,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Job `id` of `kind`, created and started (`created`, then `running`): the handle its
    /// work reports through.
    pub fn start(&self, id: &str, kind: JobType, flags: JobFlags) -> Result<JobHandle, JobError> {
        let mut table = self.lock();
        if !id_wellformed(id) {
            return Err(JobError::InvalidId(id.to_string()));
        }
        if table.jobs.iter().any(|j| j.info.id == id) {
            return Err(JobError::InUse(id.to_string()));
        }
        table.serials += 1;
        let serial = table.serials;
        let job = Job {
            info: JobInfo {
                id: id.to_string(),
                kind,
                status: JobStatus::Created,
                current: 0,
                total: 0,
                error: None,
                speed: 0,
                flags,
                user_paused: false,
            },
            serial,
            cancelled: false,
            finalizer: None,
            rate: (Instant::now(), 0),
            nodes: Vec::new(),
        };
        self.announce(&job.info);
        table.jobs.insert(0, job);
        self.transition(&mut table.jobs[0], JobStatus::Running);
        Ok(JobHandle {
            jobs: self.clone(),
            serial,
        })
    }

    /// Every job, newest first.
    pub fn query(&self) -> Vec<JobInfo> {
        self.lock().jobs.iter().map(|j| j.info.clone()).collect()
    }

    fn announce(&self, info: &JobInfo) {
        self.events.send(Event::new(
            "JOB_STATUS_CHANGE",
            json!({ "id": info.id, "status": info.status.name() }),
        ));
    }

    /// Moves `job` to `next` (a move QEMU's table allows; any other is a bug and is not
    /// made) and announces it.
    pub(super) fn transition(&self, job: &mut Job, next: JobStatus) {
        if !job.info.status.may_become(next) {
            debug_assert!(false, "job {}: {} -> {next}", job.info.id, job.info.status);
            return;
        }
        job.info.status = next;
        self.announce(&job.info);
    }

    /// Applies `verb` to job `id` after QEMU's checks; `then` does the verb's work.
    fn verb<T>(
        &self,
        id: &str,
        verb: JobVerb,
        then: impl FnOnce(&Jobs, &mut Table, usize) -> Result<T, JobError>,
    ) -> Result<T, JobError> {
        let mut table = self.lock();
        let at = table
            .jobs
            .iter()
            .position(|j| j.info.id == id)
            .ok_or(JobError::NotFound)?;
        verb.check(id, table.jobs[at].info.status)?;
        then(self, &mut table, at)
    }

    /// `job-cancel`: a running job ends cancelled when its work returns; a pending one is
    /// aborted now.
    pub fn cancel(&self, id: &str) -> Result<(), JobError> {
        self.verb(id, JobVerb::Cancel, |jobs, table, at| {
            let job = &mut table.jobs[at];
            job.cancelled = true;
            job.info.user_paused = false;
            jobs.wake.notify_all();
            if matches!(job.info.status, JobStatus::Waiting | JobStatus::Pending) {
                jobs.end(table, at, Err(String::new()));
            }
            Ok(())
        })
    }

    /// `job-pause`.
    pub fn pause(&self, id: &str) -> Result<(), JobError> {
        self.verb(id, JobVerb::Pause, |_, table, at| {
            let job = &mut table.jobs[at];
            if std::mem::replace(&mut job.info.user_paused, true) {
                return Err(JobError::AlreadyPaused);
            }
            Ok(())
        })
    }

    /// `job-resume` (QEMU asks whether the user paused the job before the verb's check).
    pub fn resume(&self, id: &str) -> Result<(), JobError> {
        let mut table = self.lock();
        let job = table
            .jobs
            .iter_mut()
            .find(|j| j.info.id == id)
            .ok_or(JobError::NotFound)?;
        if !job.info.user_paused {
            return Err(JobError::NotPaused);
        }
        JobVerb::Resume.check(id, job.info.status)?;
        job.info.user_paused = false;
        self.wake.notify_all();
        Ok(())
    }

    /// `job-complete` (no kind served here has a completion).
    pub fn complete(&self, id: &str) -> Result<(), JobError> {
        self.verb(id, JobVerb::Complete, |_, _, _| {
            Err(JobError::CannotComplete(id.to_string()))
        })
    }

    /// `job-finalize`: a pending job is finalized (concluded).
    pub fn finalize(&self, id: &str) -> Result<(), JobError> {
        self.verb(id, JobVerb::Finalize, |jobs, table, at| {
            jobs.conclude(table, at);
            Ok(())
        })
    }

    /// `job-dismiss`: a concluded job is gone (`null`).
    pub fn dismiss(&self, id: &str) -> Result<(), JobError> {
        self.verb(id, JobVerb::Dismiss, |jobs, table, at| {
            jobs.dismiss_at(table, at);
            Ok(())
        })
    }

    fn dismiss_at(&self, table: &mut Table, at: usize) {
        self.transition(&mut table.jobs[at], JobStatus::Null);
        table.jobs.remove(at);
    }

    /// Concludes job `at` (finalized, or aborted): its kind's end run, a block job's
    /// `BLOCK_JOB_COMPLETED` or `BLOCK_JOB_CANCELLED` sent (QEMU's finalize notifiers), then
    /// concluded, and dismissed at once with auto-dismiss.
    fn conclude(&self, table: &mut Table, at: usize) {
        let job = &mut table.jobs[at];
        if let Some(finalize) = job.finalizer.take() {
            finalize(job.info.error.is_none());
        }
        if job.info.kind.is_block_job() {
            self.events.send(ended_event(&job.info, job.cancelled));
        }
        self.transition(&mut table.jobs[at], JobStatus::Concluded);
        if table.jobs[at].info.flags.auto_dismiss {
            self.dismiss_at(table, at);
        }
    }

    /// Job `at`'s work returned `ret` (an error's text, empty for a cancel): QEMU's
    /// `job_completed` for a job alone in its transaction.
    fn end(&self, table: &mut Table, at: usize, ret: Result<(), String>) {
        let job = &mut table.jobs[at];
        if !matches!(
            job.info.status,
            JobStatus::Created | JobStatus::Running | JobStatus::Waiting | JobStatus::Pending
        ) {
            return;
        }
        let ret = match ret {
            Ok(()) if job.cancelled => Err(String::new()),
            other => other,
        };
        match ret {
            Ok(()) => {
                if job.info.status != JobStatus::Pending {
                    self.transition(job, JobStatus::Waiting);
                    self.transition(job, JobStatus::Pending);
                }
                if job.info.flags.auto_finalize {
                    self.conclude(table, at);
                }
            }
            Err(text) => {
                // QEMU's text for a job that failed without one: strerror(ECANCELED).
                let text = if text.is_empty() {
                    "Operation canceled".to_string()
                } else {
                    text
                };
                job.info.error.get_or_insert(text);
                self.transition(job, JobStatus::Aborting);
                self.conclude(table, at);
            }
        }
    }
}

/// `BLOCK_JOB_CANCELLED` for a cancelled job, else `BLOCK_JOB_COMPLETED` (with its error if
/// it failed), as QEMU sends them when a block job is finalized or aborted.
fn ended_event(info: &JobInfo, cancelled: bool) -> Event {
    let mut data = json!({
        "device": info.id,
        "len": info.total,
        "offset": info.current,
        "speed": info.speed,
        "type": info.kind.name(),
    });
    if cancelled {
        return Event::new("BLOCK_JOB_CANCELLED", data);
    }
    if let Some(error) = &info.error {
        data["error"] = json!(error);
    }
    Event::new("BLOCK_JOB_COMPLETED", data)
}

impl JobHandle {
    pub(super) fn with(&self, f: impl FnOnce(&Jobs, &mut Table, usize)) {
        let mut table = self.jobs.lock();
        if let Some(at) = table.jobs.iter().position(|j| j.serial == self.serial) {
            f(&self.jobs, &mut table, at);
        }
    }

    /// Sets the work left to do (QEMU's `job_progress_set_remaining`).
    pub fn set_remaining(&self, remaining: u64) {
        self.with(|_, table, at| {
            let info = &mut table.jobs[at].info;
            info.total = info.current + remaining;
        });
    }

    /// Counts `done` more units of work done (QEMU's `job_progress_update`).
    pub fn progress(&self, done: u64) {
        self.with(|_, table, at| {
            let info = &mut table.jobs[at].info;
            info.current += done;
            info.total = info.total.max(info.current);
        });
    }

    /// The work returned: `Ok`, or the error's text.
    pub fn finish(self, ret: Result<(), String>) {
        self.with(|jobs, table, at| jobs.end(table, at, ret));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATE: JobFlags = JobFlags {
        auto_finalize: true,
        auto_dismiss: false,
    };

    #[test]
    fn ids_are_checked_as_qemu_checks_them() {
        let jobs = Jobs::default();
        for bad in ["", "1a", "a b", "a#"] {
            assert_eq!(
                jobs.start(bad, JobType::Create, CREATE).err(),
                Some(JobError::InvalidId(bad.into()))
            );
        }
        let _a = jobs.start("a-1._x", JobType::Create, CREATE).unwrap();
        assert_eq!(
            jobs.start("a-1._x", JobType::Create, CREATE)
                .err()
                .unwrap()
                .to_string(),
            "Job ID 'a-1._x' already in use"
        );
    }

    #[test]
    fn a_job_runs_concludes_and_is_dismissed() {
        let jobs = Jobs::default();
        let first = jobs.start("j0", JobType::Create, CREATE).unwrap();
        let _second = jobs.start("j1", JobType::Create, CREATE).unwrap();
        let ids: Vec<_> = jobs.query().into_iter().map(|j| j.id).collect();
        assert_eq!(ids, ["j1", "j0"], "newest first");
        assert_eq!(
            jobs.dismiss("j0").unwrap_err().to_string(),
            "Job 'j0' in state 'running' cannot accept command verb 'dismiss'"
        );
        jobs.pause("j0").unwrap();
        assert_eq!(jobs.pause("j0"), Err(JobError::AlreadyPaused));
        jobs.resume("j0").unwrap();
        assert_eq!(jobs.resume("j0"), Err(JobError::NotPaused));
        first.set_remaining(1);
        first.progress(1);
        first.finish(Ok(()));
        let j0 = jobs.query().into_iter().find(|j| j.id == "j0").unwrap();
        assert_eq!(
            (j0.status, j0.current, j0.total),
            (JobStatus::Concluded, 1, 1)
        );
        assert_eq!(
            jobs.complete("j0").unwrap_err().to_string(),
            "Job 'j0' in state 'concluded' cannot accept command verb 'complete'"
        );
        jobs.dismiss("j0").unwrap();
        assert_eq!(jobs.dismiss("j0"), Err(JobError::NotFound));
    }

    #[test]
    fn a_failed_or_cancelled_job_concludes_with_its_error() {
        let jobs = Jobs::default();
        jobs.start("f", JobType::Create, CREATE)
            .unwrap()
            .finish(Err("Could not create 'x': No such file or directory".into()));
        let c = jobs.start("c", JobType::Create, CREATE).unwrap();
        jobs.cancel("c").unwrap();
        c.finish(Ok(()));
        let listed = jobs.query();
        assert_eq!(listed[0].error.as_deref(), Some("Operation canceled"));
        assert_eq!(
            listed[1].error.as_deref(),
            Some("Could not create 'x': No such file or directory")
        );
        assert!(listed.iter().all(|j| j.status == JobStatus::Concluded));
    }
}
