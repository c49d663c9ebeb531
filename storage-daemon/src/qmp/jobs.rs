//! The job commands: `query-jobs`, `job-cancel`, `job-pause`, `job-resume`,
//! `job-complete`, `job-finalize`, `job-dismiss` and `query-block-jobs`, with QEMU's
//! arguments, results and texts (QEMU's `job-qmp.c`).
//!
//! This module owns the commands' arguments and replies; the jobs and their lifecycle are
//! the daemon's job table ([`crate::job::Jobs`]), the jobs' kinds their own modules
//! (`blockdev-create`'s is `create`).

use serde_json::{json, Map, Value};

use super::commands::{Command, State};
use super::wire::{Args, QmpError};
use crate::job::{JobError, JobInfo, Jobs};

/// The job commands.
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "query-jobs",
        run: |state, _, args| {
            args.finish()?;
            Ok(Value::Array(
                state.jobs.query().iter().map(job_info).collect(),
            ))
        },
    },
    Command {
        name: "query-block-jobs",
        run: |state, _, args| {
            args.finish()?;
            let block_jobs = state
                .jobs
                .query()
                .into_iter()
                .filter(|j| j.kind.is_block_job());
            Ok(Value::Array(
                block_jobs.map(|j| block_job_info(&j)).collect(),
            ))
        },
    },
    Command {
        name: "job-cancel",
        run: |state, _, args| by_id(state, args, Jobs::cancel),
    },
    Command {
        name: "job-pause",
        run: |state, _, args| by_id(state, args, Jobs::pause),
    },
    Command {
        name: "job-resume",
        run: |state, _, args| by_id(state, args, Jobs::resume),
    },
    Command {
        name: "job-complete",
        run: |state, _, args| by_id(state, args, Jobs::complete),
    },
    Command {
        name: "job-finalize",
        run: |state, _, args| by_id(state, args, Jobs::finalize),
    },
    Command {
        name: "job-dismiss",
        run: |state, _, args| by_id(state, args, Jobs::dismiss),
    },
];

/// A verb on the job named by the `id` argument.
fn by_id(
    state: &mut State,
    mut args: Args,
    verb: fn(&Jobs, &str) -> Result<(), JobError>,
) -> Result<Value, QmpError> {
    let id = args.str("id")?;
    args.finish()?;
    verb(&state.jobs, &id)?;
    Ok(json!({}))
}

/// QEMU's `JobInfo` for `job`.
fn job_info(job: &JobInfo) -> Value {
    let mut info = Map::new();
    info.insert("id".into(), json!(job.id));
    info.insert("type".into(), json!(job.kind.name()));
    info.insert("status".into(), json!(job.status.name()));
    info.insert("current-progress".into(), json!(job.current));
    info.insert("total-progress".into(), json!(job.total));
    if let Some(error) = &job.error {
        info.insert("error".into(), json!(error));
    }
    Value::Object(info)
}

/// QEMU's `BlockJobInfo` for block job `job` (`device` is its id, as QEMU's is for a job
/// of a node without a device).
fn block_job_info(job: &JobInfo) -> Value {
    use crate::job::JobStatus;
    let running = matches!(job.status, JobStatus::Running | JobStatus::Ready);
    let mut info = json!({
        "auto-finalize": job.flags.auto_finalize,
        "auto-dismiss": job.flags.auto_dismiss,
        "io-status": "ok",
        "device": job.id,
        // Busy while its work runs (not paused, not yet finished).
        "busy": running && !job.user_paused,
        "len": job.total,
        "offset": job.current,
        "status": job.status.name(),
        "paused": job.user_paused,
        "speed": job.speed,
        "ready": job.status == JobStatus::Ready,
        "type": job.kind.name(),
    });
    if let Some(error) = &job.error {
        info["error"] = json!(error);
    }
    info
}
