//! A job's states and verbs, and QEMU's two tables over them (`JobSTT` and `JobVerbTable`
//! in QEMU's `job.c`).
//!
//! This module owns the tables and their texts, never a job's state itself: whoever holds
//! a job keeps its status and asks here before changing it.

use std::fmt;

/// A job's state, QEMU's `JobStatus` (its QMP name by [`JobStatus::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// Created, not yet started.
    Created,
    /// Running.
    Running,
    /// Running, paused (by the user or a drain).
    Paused,
    /// Running, ready for the user to complete it (a mirror in sync).
    Ready,
    /// Ready, paused.
    Standby,
    /// Done, waiting for the other jobs of its transaction.
    Waiting,
    /// Done, waiting to be finalized (`job-finalize`, or at once with `auto-finalize`).
    Pending,
    /// Failed or cancelled, its effects being undone.
    Aborting,
    /// Ended; waiting to be dismissed (`job-dismiss`, or at once with `auto-dismiss`).
    Concluded,
    /// Gone: dismissed, no longer listed.
    Null,
}

/// The states in QEMU's order (its `JobStatus` enum, `undefined` left out: no job is ever in
/// it).
const ALL: [JobStatus; 10] = [
    JobStatus::Created,
    JobStatus::Running,
    JobStatus::Paused,
    JobStatus::Ready,
    JobStatus::Standby,
    JobStatus::Waiting,
    JobStatus::Pending,
    JobStatus::Aborting,
    JobStatus::Concluded,
    JobStatus::Null,
];

impl JobStatus {
    /// Every state, in QEMU's order.
    pub fn all() -> [JobStatus; 10] {
        ALL
    }

    /// The state's name in QMP (`"running"`, `"concluded"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Created => "created",
            JobStatus::Running => "running",
            JobStatus::Paused => "paused",
            JobStatus::Ready => "ready",
            JobStatus::Standby => "standby",
            JobStatus::Waiting => "waiting",
            JobStatus::Pending => "pending",
            JobStatus::Aborting => "aborting",
            JobStatus::Concluded => "concluded",
            JobStatus::Null => "null",
        }
    }

    /// Whether a job in this state may move to `next`: QEMU's `JobSTT`.
    pub fn may_become(self, next: JobStatus) -> bool {
        use JobStatus::*;
        matches!(
            (self, next),
            (Created, Running | Aborting | Null)
                | (Running, Paused | Ready | Waiting | Aborting)
                | (Paused, Running)
                | (Ready, Standby | Waiting | Aborting)
                | (Standby, Ready)
                | (Waiting, Pending | Aborting)
                | (Pending, Aborting | Concluded)
                | (Aborting, Aborting | Concluded)
                | (Concluded, Null)
        )
    }

    /// Whether the job is ready to be completed (`ready`, or `standby`: a ready job paused).
    pub fn is_ready(self) -> bool {
        matches!(self, JobStatus::Ready | JobStatus::Standby)
    }

    /// Whether the job's work is done (`waiting` and every state after it).
    pub fn is_completed(self) -> bool {
        matches!(
            self,
            JobStatus::Waiting
                | JobStatus::Pending
                | JobStatus::Aborting
                | JobStatus::Concluded
                | JobStatus::Null
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A command verb applied to a job, QEMU's `JobVerb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobVerb {
    /// `job-cancel`, `block-job-cancel`.
    Cancel,
    /// `job-pause`, `block-job-pause`.
    Pause,
    /// `job-resume`, `block-job-resume`.
    Resume,
    /// `block-job-set-speed`.
    SetSpeed,
    /// `job-complete`, `block-job-complete`.
    Complete,
    /// `job-finalize`, `block-job-finalize`.
    Finalize,
    /// `job-dismiss`, `block-job-dismiss`.
    Dismiss,
    /// `block-job-change`.
    Change,
}

impl JobVerb {
    /// The verb's name in QEMU's texts (`"cancel"`, `"set-speed"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            JobVerb::Cancel => "cancel",
            JobVerb::Pause => "pause",
            JobVerb::Resume => "resume",
            JobVerb::SetSpeed => "set-speed",
            JobVerb::Complete => "complete",
            JobVerb::Finalize => "finalize",
            JobVerb::Dismiss => "dismiss",
            JobVerb::Change => "change",
        }
    }

    /// Whether a job in `status` accepts this verb: QEMU's `JobVerbTable`.
    pub fn accepted_in(self, status: JobStatus) -> bool {
        use JobStatus::*;
        let running = matches!(status, Created | Running | Paused | Ready | Standby);
        match self {
            JobVerb::Cancel => running || matches!(status, Waiting | Pending),
            JobVerb::Pause | JobVerb::Resume | JobVerb::SetSpeed | JobVerb::Change => running,
            JobVerb::Complete => status.is_ready(),
            JobVerb::Finalize => status == Pending,
            JobVerb::Dismiss => status == Concluded,
        }
    }

    /// `Ok` when job `id` in `status` accepts this verb, else QEMU's refusal.
    pub fn check(self, id: &str, status: JobStatus) -> Result<(), VerbRefused> {
        if self.accepted_in(status) {
            Ok(())
        } else {
            Err(VerbRefused {
                id: id.to_owned(),
                status,
                verb: self,
            })
        }
    }
}

/// A verb refused by a job's state (QEMU's `job_apply_verb_locked` error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Job '{id}' in state '{status}' cannot accept command verb '{}'", verb.name())]
pub struct VerbRefused {
    /// The job's id.
    pub id: String,
    /// The state it is in.
    pub status: JobStatus,
    /// The verb it refused.
    pub verb: JobVerb,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU's `JobSTT`, row by row in its order (`undefined` left out), copied from its
    /// `job.c`: the table above must say exactly this.
    const QEMU_STT: [[u8; 10]; 10] = [
        // C, R, P, Y, S, W, D, X, E, N
        [0, 1, 0, 0, 0, 0, 0, 1, 0, 1], // created
        [0, 0, 1, 1, 0, 1, 0, 1, 0, 0], // running
        [0, 1, 0, 0, 0, 0, 0, 0, 0, 0], // paused
        [0, 0, 0, 0, 1, 1, 0, 1, 0, 0], // ready
        [0, 0, 0, 1, 0, 0, 0, 0, 0, 0], // standby
        [0, 0, 0, 0, 0, 0, 1, 1, 0, 0], // waiting
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 0], // pending
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 0], // aborting
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1], // concluded
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], // null
    ];

    /// QEMU's `JobVerbTable`, by verb, over the states in its order.
    const QEMU_VERBS: [(JobVerb, [u8; 10]); 8] = [
        (JobVerb::Cancel, [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]),
        (JobVerb::Pause, [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
        (JobVerb::Resume, [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
        (JobVerb::SetSpeed, [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
        (JobVerb::Complete, [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]),
        (JobVerb::Finalize, [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]),
        (JobVerb::Dismiss, [0, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
        (JobVerb::Change, [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
    ];

    #[test]
    fn transitions_are_qemus() {
        for (from, row) in JobStatus::all().into_iter().zip(QEMU_STT) {
            for (to, allowed) in JobStatus::all().into_iter().zip(row) {
                assert_eq!(from.may_become(to), allowed == 1, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn verbs_are_qemus() {
        for (verb, row) in QEMU_VERBS {
            for (status, allowed) in JobStatus::all().into_iter().zip(row) {
                assert_eq!(
                    verb.accepted_in(status),
                    allowed == 1,
                    "{verb:?} in {status}"
                );
            }
        }
    }

    #[test]
    fn refusal_has_qemus_text() {
        let refused = JobVerb::Complete
            .check("job0", JobStatus::Running)
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "Job 'job0' in state 'running' cannot accept command verb 'complete'"
        );
        assert!(JobVerb::Dismiss.check("job0", JobStatus::Concluded).is_ok());
        assert_eq!(
            JobVerb::SetSpeed
                .check("b", JobStatus::Waiting)
                .unwrap_err()
                .to_string(),
            "Job 'b' in state 'waiting' cannot accept command verb 'set-speed'"
        );
    }

    #[test]
    fn ready_and_completed_follow_qemu() {
        let ready: Vec<_> = JobStatus::all()
            .into_iter()
            .filter(|s| s.is_ready())
            .collect();
        assert_eq!(ready, [JobStatus::Ready, JobStatus::Standby]);
        let done: Vec<_> = JobStatus::all()
            .into_iter()
            .filter(|s| s.is_completed())
            .collect();
        assert_eq!(done.first(), Some(&JobStatus::Waiting));
        assert_eq!(done.len(), 5);
    }
}
