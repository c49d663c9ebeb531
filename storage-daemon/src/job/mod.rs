//! Block jobs' lifecycle, as QEMU's `job.c` runs it: the states a job passes through, the
//! transitions between them, and the QMP verbs each state accepts.
//!
//! This module owns the rules (which state may follow which, which verb a state accepts,
//! QEMU's refusal texts), never a job's work: a job kind (backup, mirror, stream, commit)
//! drives its own copy and asks this module whether a step is allowed. The daemon's job
//! table ([`Jobs`], `table`'s: each job's state, progress and error, and its
//! `JOB_STATUS_CHANGE` events) is built on it, and the QMP commands (`query-jobs`, `job-*`)
//! on the table.
//!
//! The contract, QEMU's:
//!
//! * A job is `created`, then `running`; `paused` and `ready` / `standby` are running states
//!   (a pause of a ready job is `standby`); a finished job is `waiting` while others of its
//!   transaction run, `pending` until finalized (at once with `auto-finalize`), `aborting` when
//!   it failed or was cancelled, `concluded` until dismissed (at once with `auto-dismiss`),
//!   and `null` when gone. [`JobStatus::may_become`] is QEMU's transition table, exactly.
//! * A verb a state does not accept is refused with QEMU's text
//!   ([`JobVerb::check`]): `Job 'ID' in state 'STATE' cannot accept command verb 'VERB'`.

mod block;
mod status;
mod table;

pub use status::{JobStatus, JobVerb, VerbRefused};
pub use table::{id_wellformed, Finalizer, JobError, JobFlags, JobHandle, JobInfo, JobType, Jobs};
