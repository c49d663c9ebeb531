//! `blockdev-backup` (alone or as a transaction's action) and the `block-job-*` verbs, with
//! QEMU's arguments (`BlockdevBackup`, `qapi/block-core.json`), checks in its order and texts
//! (`blockdev.c`'s `do_backup_common`, `block/backup.c`, `blockjob.c`).
//!
//! This module owns the arguments, the checks and starting a backup's job on a thread of its
//! own; the backup's work is `aio_block::backup`'s, the job's lifecycle the job table's.
//!
//! * **Served:** `sync` `full`, `top`, `none`, `incremental` and `bitmap` with `bitmap` and
//!   `bitmap-mode`; `speed`; `auto-finalize`, `auto-dismiss`; `on-source-error` and
//!   `on-target-error` `report` (QEMU's default: the job fails on its first error); `x-perf`
//!   (hints, taken and unused: chunks are the target's clusters, one copy at a time).
//! * **Refused, said so:** `compress` (QEMU's text for a target that cannot compress),
//!   another error policy, `discard-source`, `filter-node-name` (there is no filter node in
//!   this daemon's graph: copy-before-write is a hook of the source's image).
//! * **A job of its own thread**, never the source's iothread: the copies block that thread
//!   only; a guest write waits only for the copy of the chunks it overwrites.

use std::sync::Arc;

use serde_json::{json, Value};

use aio_block::backup::{Backup, BitmapMode, JobControl, SyncMode};
use aio_block::bitmap::DirtyBitmap;
use aio_block::block_copy::BlockCopy;
use aio_block::Image;

use super::bitmaps::refused;
use super::commands::{Command, State};
use super::staged::Staged;
use super::wire::{Args, ErrorClass, QmpError};
use crate::job::{JobError, JobFlags, JobHandle, JobType, Jobs};

/// The commands this module serves.
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "blockdev-backup",
        run: |state, _, args| {
            let prepared = state.prepare_backup(&Staged::default(), args)?;
            state.start_backup(prepared)?;
            Ok(json!({}))
        },
    },
    Command {
        name: "block-job-set-speed",
        run: |state, _, mut args| {
            let device = args.str("device")?;
            let speed = speed(&mut args)?;
            args.finish()?;
            state.jobs.set_speed(&device, speed).map_err(not_active)?;
            Ok(json!({}))
        },
    },
    Command {
        name: "block-job-cancel",
        run: |state, _, mut args| {
            let device = args.str("device")?;
            // A backup has no ready state: `force` changes nothing for it.
            args.opt_bool("force")?;
            args.finish()?;
            block_verb(&state.jobs, &device, Jobs::cancel)
        },
    },
    Command {
        name: "block-job-pause",
        run: |state, _, args| by_device(state, args, "device", Jobs::pause),
    },
    Command {
        name: "block-job-resume",
        run: |state, _, args| by_device(state, args, "device", Jobs::resume),
    },
    Command {
        name: "block-job-complete",
        run: |state, _, args| by_device(state, args, "device", Jobs::complete),
    },
    Command {
        name: "block-job-finalize",
        run: |state, _, args| by_device(state, args, "id", Jobs::finalize),
    },
    Command {
        name: "block-job-dismiss",
        run: |state, _, args| by_device(state, args, "id", Jobs::dismiss),
    },
];

/// A `block-job-*` verb on the block job named by argument `key`.
fn by_device(
    state: &mut State,
    mut args: Args,
    key: &str,
    verb: fn(&Jobs, &str) -> Result<(), JobError>,
) -> Result<Value, QmpError> {
    let id = args.str(key)?;
    args.finish()?;
    block_verb(&state.jobs, &id, verb)
}

fn block_verb(
    jobs: &Jobs,
    id: &str,
    verb: fn(&Jobs, &str) -> Result<(), JobError>,
) -> Result<Value, QmpError> {
    jobs.check_block_job(id).map_err(not_active)?;
    verb(jobs, id)?;
    Ok(json!({}))
}

/// A `block-job-*` verb's lookup failure: QEMU's class for it (`DeviceNotActive`).
fn not_active(e: JobError) -> QmpError {
    QmpError {
        class: ErrorClass::DeviceNotActive,
        desc: e.to_string(),
    }
}

/// `speed`, QEMU's check (none below zero).
fn speed(args: &mut Args) -> Result<u64, QmpError> {
    match args.opt_int("speed")? {
        None => Ok(0),
        Some(s) if s < 0 => Err(QmpError::generic(
            "Parameter 'speed' expects a non-negative value",
        )),
        Some(s) => Ok(s as u64),
    }
}

/// A backup whose checks all passed, started by [`State::start_backup`].
pub(super) struct PreparedBackup {
    id: String,
    nodes: Vec<String>,
    source: Arc<Image>,
    target: Arc<Image>,
    sync: SyncMode,
    bitmap: Option<(Arc<DirtyBitmap>, BitmapMode)>,
    flags: JobFlags,
    speed: u64,
}

/// `BlockdevBackup`'s arguments as read, before the checks.
struct BackupArgs {
    id: String,
    device: String,
    target: String,
    sync: &'static str,
    bitmap: Option<String>,
    bitmap_mode: Option<&'static str>,
    flags: JobFlags,
    speed: u64,
}

const SYNC_MODES: &[&str] = &["top", "full", "none", "incremental", "bitmap"];
const BITMAP_MODES: &[&str] = &["on-success", "never", "always"];
const ERROR_POLICIES: &[&str] = &["report", "ignore", "enospc", "stop", "auto"];

fn not_served(what: &str) -> QmpError {
    QmpError::generic(format!(
        "{what}: not served by aio-storage-daemon (a backup fails on its first error, copies \
         uncompressed and keeps its source)"
    ))
}

impl BackupArgs {
    fn parse(mut args: Args) -> Result<BackupArgs, QmpError> {
        let id = args.opt_str("job-id")?;
        let device = args.str("device")?;
        let target = args.str("target")?;
        let sync = args
            .opt_enum("sync", SYNC_MODES)?
            .ok_or_else(|| args.missing("sync"))?;
        let speed = speed(&mut args)?;
        let bitmap = args.opt_str("bitmap")?;
        let bitmap_mode = args.opt_enum("bitmap-mode", BITMAP_MODES)?;
        let compress = args.opt_bool("compress")?.unwrap_or(false);
        for key in ["on-source-error", "on-target-error"] {
            if let Some(policy) = args.opt_enum(key, ERROR_POLICIES)? {
                if policy != "report" {
                    return Err(not_served(&format!("{key}={policy}")));
                }
            }
        }
        let flags = JobFlags {
            auto_finalize: args.opt_bool("auto-finalize")?.unwrap_or(true),
            auto_dismiss: args.opt_bool("auto-dismiss")?.unwrap_or(true),
        };
        if args.opt_str("filter-node-name")?.is_some() {
            return Err(not_served("filter-node-name"));
        }
        // Hints only (see the module's contract).
        args.opt_object("x-perf")?;
        if args.opt_bool("discard-source")?.unwrap_or(false) {
            return Err(not_served("discard-source=on"));
        }
        args.finish()?;
        if compress {
            return Err(QmpError::generic(format!(
                "Compression is not supported for this drive {target}"
            )));
        }
        Ok(BackupArgs {
            // QEMU names a job without an id after its node's device, which a daemon's
            // nodes have not: the empty id, refused as invalid when the job is made.
            id: id.unwrap_or_default(),
            device,
            target,
            sync,
            bitmap,
            bitmap_mode,
            flags,
            speed,
        })
    }
}

impl State {
    /// Reads and checks a `blockdev-backup` (after the transaction actions `staged` holds:
    /// a bitmap one of them adds is seen), in QEMU's order; nothing changes.
    pub(super) fn prepare_backup(
        &self,
        staged: &Staged,
        args: Args,
    ) -> Result<PreparedBackup, QmpError> {
        let a = BackupArgs::parse(args)?;
        let source = self.held_image(&a.device)?;
        let target = self.held_image(&a.target)?;
        let mut sync = a.sync;
        let mut bitmap_mode = a.bitmap_mode;
        if matches!(sync, "bitmap" | "incremental") && a.bitmap.is_none() {
            return Err(QmpError::generic(format!(
                "must provide a valid bitmap name for '{sync}' sync mode"
            )));
        }
        if sync == "incremental" {
            if bitmap_mode.is_some_and(|m| m != "on-success") {
                return Err(QmpError::generic(
                    "Bitmap sync mode must be 'on-success' when using sync mode 'incremental'",
                ));
            }
            (sync, bitmap_mode) = ("bitmap", Some("on-success"));
        }
        let bitmap = match (&a.bitmap, bitmap_mode) {
            (Some(name), mode) => {
                let bitmap = match staged.added(&a.device, name) {
                    Some(b) => b,
                    None => source.dirty_bitmaps().get(name).ok_or_else(|| {
                        QmpError::generic(format!("Bitmap '{name}' could not be found"))
                    })?,
                };
                let mode = mode.ok_or_else(|| {
                    QmpError::generic("Bitmap sync mode must be given when providing a bitmap")
                })?;
                bitmap.check_usable().map_err(refused)?;
                if sync == "none" {
                    return Err(QmpError::generic(
                        "sync mode 'none' does not produce meaningful bitmap outputs",
                    ));
                }
                if mode == "never" && sync != "bitmap" {
                    return Err(QmpError::generic(format!(
                        "Bitmap sync mode 'never' has no meaningful effect when combined \
                         with sync mode '{sync}'"
                    )));
                }
                Some((bitmap, bitmap_mode_of(mode)))
            }
            (None, Some(_)) => {
                return Err(QmpError::generic(
                    "Cannot specify bitmap sync mode without a bitmap",
                ))
            }
            (None, None) => None,
        };
        let copy_refused =
            |e: aio_block::block_copy::BlockCopyError| QmpError::generic(e.to_string());
        if Arc::ptr_eq(&source, &target) {
            return Err(copy_refused(
                aio_block::block_copy::BlockCopyError::SameImage,
            ));
        }
        self.jobs.check_node_free(&a.device)?;
        self.jobs.check_node_free(&a.target)?;
        BlockCopy::check(&source, &target).map_err(copy_refused)?;
        if !crate::job::id_wellformed(&a.id) {
            return Err(JobError::InvalidId(a.id).into());
        }
        if self.jobs.query().iter().any(|j| j.id == a.id) {
            return Err(JobError::InUse(a.id).into());
        }
        Ok(PreparedBackup {
            id: a.id,
            // QEMU blocks the target (and its filter node), not the source: two backups of
            // one disk may run at once.
            nodes: vec![a.target],
            source,
            target,
            sync: sync_mode_of(sync),
            bitmap,
            flags: a.flags,
            speed: a.speed,
        })
    }

    /// Starts a prepared backup: its job made (QEMU's `created`, `running`), shown `paused`
    /// while copy-before-write is attached, then run on a thread of its own.
    pub(super) fn start_backup(&self, p: PreparedBackup) -> Result<(), QmpError> {
        let job = self.jobs.start(&p.id, JobType::Backup, p.flags)?;
        job.set_speed(p.speed);
        job.use_nodes(p.nodes);
        let started =
            job.quiesced(|| Backup::start(&p.source, p.target.clone(), p.sync, p.bitmap.clone()));
        let backup = match started {
            Ok(backup) => Arc::new(backup),
            Err(e) => {
                job.finish(Err(e.to_string()));
                return Ok(());
            }
        };
        job.set_remaining(backup.total());
        let at_end = backup.clone();
        job.set_finalizer(Box::new(move |succeeded| at_end.finish(succeeded)));
        spawn(job, backup);
        Ok(())
    }
}

fn sync_mode_of(name: &str) -> SyncMode {
    match name {
        "full" => SyncMode::Full,
        "top" => SyncMode::Top,
        "none" => SyncMode::None,
        _ => SyncMode::Bitmap,
    }
}

fn bitmap_mode_of(name: &str) -> BitmapMode {
    match name {
        "never" => BitmapMode::Never,
        "always" => BitmapMode::Always,
        _ => BitmapMode::OnSuccess,
    }
}

/// A backup's job as its work sees it.
struct Control(JobHandle);

impl JobControl for Control {
    fn checkpoint(&self) -> bool {
        self.0.checkpoint()
    }

    fn progress(&self, bytes: u64) {
        self.0.progress(bytes);
        self.0.throttle(bytes);
    }

    fn wait_for_cancel(&self) {
        self.0.wait_for_cancel();
    }
}

/// Runs `backup` on a thread of its own, its end told to `job`.
fn spawn(job: JobHandle, backup: Arc<Backup>) {
    let on_thread = job.clone();
    let started = std::thread::Builder::new()
        .name("backup".into())
        .spawn(move || {
            let ret = backup.run(&Control(on_thread.clone()));
            drop(backup);
            on_thread.finish(ret.map_err(|e| aio_block::create::strerror(&e)));
        });
    if let Err(e) = started {
        job.finish(Err(format!("Could not start the job: {e}")));
    }
}
