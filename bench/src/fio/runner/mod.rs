//! Running fio job files (`aio-bench run`) through aio-rs engines.
//!
//! This module owns what happens between a parsed [`JobFile`](crate::fio::jobfile::JobFile) and its
//! report: the target file of each job (an existing file or device used as it is, or an image
//! created for the run and removed afterwards), the choice of backends (`auto` resolved by the
//! probe order), the `numjobs` clones (each its own thread, loop and engine, reported together like
//! fio's `group_reporting`) and the `iothreads=` shares of each clone (each its own thread, loop
//! and engine, in its own region of the file, reported together too). A trim job's engine is paired
//! with the thread pool for the discards it cannot run ([`EngineKind::build`]). Its reports are
//! formatted by [`super::output`].

use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use aio_core::engine::IoFile;

use crate::fio::job::{run_job_in, JobResult, JobSpec};
use crate::fio::jobfile::JobDef;
use crate::targets::image::DiskImage;
use aio::{Choice, EngineKind, EngineOptions, MonitorKind};

/// A job that could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The job's target file is unusable.
    #[error("job '{job}' (line {line}): {path}: {reason}")]
    Target {
        /// The job.
        job: String,
        /// Its section's line.
        line: usize,
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The job would write to a block device in use (mounted, holding a mounted partition,
    /// held by device-mapper, or swap) without `allow_mounted_write=1`: bad input, exit 2.
    #[error("job '{job}' (line {line}): {reason}")]
    InUse {
        /// The job.
        job: String,
        /// Its section's line.
        line: usize,
        /// The device and why it is in use, naming the option.
        reason: String,
    },
    /// The files the job would create need more space than their file system has free
    /// (fio would write until the file system is full): bad input, exit 2, refused before
    /// anything is written.
    #[error(
        "job '{job}' (line {line}): {path}: size={size} bytes to create, but the file system \
         has {free} bytes free"
    )]
    NoSpace {
        /// The job.
        job: String,
        /// Its section's line.
        line: usize,
        /// The first file it would create.
        path: String,
        /// The bytes the job would create (size= for each file to make).
        size: u64,
        /// The bytes free for an unprivileged user there.
        free: u64,
    },
    /// A backend could not be built, or the run failed.
    #[error("job '{job}' (line {line}): {reason}")]
    Run {
        /// The job.
        job: String,
        /// Its section's line.
        line: usize,
        /// What failed.
        reason: String,
    },
}

impl From<RunError> for io::Error {
    fn from(e: RunError) -> Self {
        io::Error::other(e)
    }
}

/// One job's results, its clones together.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// The job as parsed.
    pub def: JobDef,
    /// The engine it ran on.
    pub engine: EngineKind,
    /// The fd monitor it ran on (`auto` resolved).
    pub fdmon: MonitorKind,
    /// The file (of the first clone).
    pub file: PathBuf,
    /// What it measured, clones merged.
    pub result: JobResult,
}

/// The file a job clone works on, and the image guard when the run created it.
struct Target {
    path: PathBuf,
    file: IoFile,
    size: u64,
    _created: Option<DiskImage>,
}

/// The file job clone `clone` works on (fio's `directory=` and `filename=`).
fn target_path(def: &JobDef, clone: u64) -> PathBuf {
    let dir = def.directory.clone().unwrap_or_else(|| PathBuf::from("."));
    match &def.filename {
        Some(f) if f.is_absolute() => f.clone(),
        Some(f) => dir.join(f),
        // fio's default name: jobname.jobnumber.filenumber.
        None => dir.join(format!("{}.{clone}.0", def.name)),
    }
}

/// Refuses, before any file is made, a job whose new files need more than their file system
/// has free. Existing files and block devices are used as they are (the size is capped to
/// them), so only files that do not exist yet count, `size=` bytes each.
fn check_space(def: &JobDef, clones: u64) -> Result<(), RunError> {
    let Some(size) = def.size else {
        return Ok(());
    };
    let new: Vec<PathBuf> = (0..clones)
        .map(|n| target_path(def, n))
        .filter(|p| !p.exists())
        .collect();
    let Some(first) = new.first() else {
        return Ok(());
    };
    // A directory that cannot be looked at fails when the file is made, with its reason.
    let dir = crate::targets::image::dir_of(first);
    let Some(free) = crate::targets::image::free_bytes_of(dir) else {
        return Ok(());
    };
    let needed = size.saturating_mul(new.len() as u64);
    if needed > free {
        return Err(RunError::NoSpace {
            job: def.name.clone(),
            line: def.line,
            path: first.display().to_string(),
            size: needed,
            free,
        });
    }
    Ok(())
}

fn target(def: &JobDef, clone: u64) -> Result<Target, RunError> {
    let path = target_path(def, clone);
    let fail = |reason: String| RunError::Target {
        job: def.name.clone(),
        line: def.line,
        path: path.display().to_string(),
        reason,
    };
    let writes = def.rw.modifies(def.rwmixread);
    if writes && !def.allow_mounted_write {
        if let Some(reason) = crate::targets::mounted::in_use(&path, "allow_mounted_write") {
            return Err(RunError::InUse {
                job: def.name.clone(),
                line: def.line,
                reason,
            });
        }
    }
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(writes);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(&path)
    };
    if path.exists() {
        let mut f = open(def.direct).map_err(|e| fail(format!("open: {e}")))?;
        // Seeking to the end gives the size of regular files and block devices alike.
        let len = f
            .seek(SeekFrom::End(0))
            .map_err(|e| fail(format!("size: {e}")))?;
        let mut size = def.size.unwrap_or(len);
        let is_device = {
            use std::os::unix::fs::FileTypeExt;
            f.metadata().is_ok_and(|m| m.file_type().is_block_device())
        };
        if is_device {
            // fio's meaning: a device's size caps size=.
            size = size.min(len);
        }
        if size > len {
            return Err(fail(format!(
                "is {len} bytes, less than size={size}; aio-bench does not extend existing files"
            )));
        }
        return Ok(Target {
            path: path.clone(),
            file: IoFile::from(f),
            size,
            _created: None,
        });
    }
    let size = def
        .size
        .ok_or_else(|| fail("does not exist, and the job has no size= to create it with".into()))?;
    let image = if def.direct {
        DiskImage::create(path.clone(), size, clone as u8)
    } else {
        DiskImage::create_buffered(path.clone(), size, clone as u8)
    }
    .map_err(|e| fail(e.to_string()))?;
    let file = image.file().clone();
    Ok(Target {
        path,
        file,
        size,
        _created: Some(image),
    })
}

/// The options `def`'s engine is built with: fio's io_uring options (`registerfiles`,
/// `fixedbufs`, ours `uring_taskrun`), the pool's `pool_spin`, and a thread pool behind the
/// engine for a trim job's discards. An option for another engine than the job's is refused,
/// naming it.
fn engine_options(def: &JobDef, engine: EngineKind) -> Result<EngineOptions, String> {
    let uring_set = def.register_files || def.fixed_bufs || def.uring_task_run != "auto";
    if uring_set && engine != EngineKind::Uring {
        return Err(format!(
            "registerfiles, fixedbufs and uring_taskrun are io_uring options; this engine is {}",
            crate::fio::ioengine(engine)
        ));
    }
    if !def.pool_spin.is_zero() && engine != EngineKind::Pool {
        return Err(format!(
            "pool_spin is a thread-pool option (ioengine=psync and its kin); this engine is {}",
            crate::fio::ioengine(engine)
        ));
    }
    #[allow(unused_mut)]
    let mut options = EngineOptions::default().with_fallback_pool(def.rw.is_trim());
    #[cfg(feature = "uring")]
    {
        let task_run = aio_backend_uring::TaskRun::from_name(def.uring_task_run)
            .ok_or_else(|| format!("uring_taskrun={}: unknown", def.uring_task_run))?;
        let fixed_buffers = if def.fixed_bufs {
            def.iodepth as u32
        } else {
            0
        };
        options = options.with_uring(
            options
                .uring
                .with_register_files(def.register_files)
                .with_fixed_buffers(fixed_buffers)
                .with_task_run(task_run),
        );
    }
    #[cfg(feature = "pool")]
    {
        options = options.with_pool(options.pool.with_spin(def.pool_spin));
    }
    Ok(options)
}

/// The CPUs clone `n` of `def` runs on (fio's `cpus_allowed` and `cpus_allowed_policy`).
fn clone_cpus(def: &JobDef, n: usize) -> Option<Vec<usize>> {
    let cpus = def.cpus_allowed.as_ref().filter(|c| !c.is_empty())?;
    Some(if def.cpus_split {
        vec![cpus[n % cpus.len()]]
    } else {
        cpus.clone()
    })
}

/// The engine and monitor a job runs on.
fn backends(def: &JobDef) -> Result<(EngineKind, MonitorKind), RunError> {
    let fdmon = match def.fdmon {
        Choice::Named(k) => k,
        Choice::Auto => {
            MonitorKind::auto()
                .map_err(|e| RunError::Run {
                    job: def.name.clone(),
                    line: def.line,
                    reason: e.to_string(),
                })?
                .kind
        }
    };
    Ok((def.engine, fdmon))
}

/// One iothread's share of a job clone (`iothreads=`): its region of the file, its part of
/// `iodepth` and of the idle disks.
#[derive(Debug, Clone, PartialEq)]
struct Share {
    /// Which iothread (0-based).
    index: usize,
    /// Its bytes of the file.
    region: std::ops::Range<u64>,
    /// Requests it keeps in flight.
    iodepth: usize,
    /// Idle disks registered in its loop.
    idle_fds: usize,
}

impl Share {
    /// The region's length.
    fn len(&self) -> u64 {
        self.region.end - self.region.start
    }

    /// `spec` (made for the region's size) with this share's iodepth and idle disks.
    fn apply(&self, spec: JobSpec) -> JobSpec {
        JobSpec {
            iodepth: self.iodepth,
            idle_fds: self.idle_fds,
            ..spec
        }
    }
}

/// How `iothreads` iothreads share one clone of `def` on a file of `size` bytes: iothread `t`
/// gets the `t`-th of `iothreads` equal runs of whole blocks (the last one what is left),
/// `iodepth / iothreads` requests in flight (one more for the first `iodepth % iothreads`)
/// and the idle disks `i` (1-based, of `disks - 1`) with `i % iothreads == t`. With one
/// iothread, the whole file, `iodepth` and every idle disk.
fn shares(def: &JobDef, size: u64, iothreads: usize) -> Vec<Share> {
    let bs = def.bs.max(1);
    let blocks = size / bs;
    let k = iothreads as u64;
    (0..iothreads)
        .map(|t| {
            let t64 = t as u64;
            let start = blocks * t64 / k * bs;
            let end = if t64 + 1 == k {
                size
            } else {
                blocks * (t64 + 1) / k * bs
            };
            Share {
                index: t,
                region: start..end,
                iodepth: (def.iodepth / k + u64::from(t64 < def.iodepth % k)) as usize,
                idle_fds: (1..def.disks).filter(|i| i % k == t64).count(),
            }
        })
        .collect()
}

/// Runs one job: its clones in parallel, each on `iothreads` threads (one by default) with
/// their own loop and engine.
pub fn run_one(def: &JobDef) -> Result<JobReport, RunError> {
    // `disks=` registers a notifier per idle disk in each clone's loop.
    aio::process::raise_fd_limit();
    let (engine, fdmon) = backends(def)?;
    let failed = |reason: String| RunError::Run {
        job: def.name.clone(),
        line: def.line,
        reason,
    };
    let options = engine_options(def, engine).map_err(failed)?;
    check_space(
        def,
        if def.filename.is_some() {
            1
        } else {
            def.numjobs
        },
    )?;
    let targets: Vec<Target> = if def.filename.is_some() {
        vec![target(def, 0)?]
    } else {
        (0..def.numjobs)
            .map(|n| target(def, n))
            .collect::<Result<_, _>>()?
    };
    let spec = |size: u64| JobSpec {
        pattern: def.rw,
        rwmixread: def.rwmixread,
        bs: def.bs as usize,
        iodepth: def.iodepth as usize,
        // Without runtime, fio runs until the job's size is done.
        runtime: def.runtime.unwrap_or(crate::units::MAX_DURATION),
        ramp: def.ramp,
        poll_max_ns: def.poll_max_ns,
        poll_rule: def.poll_rule,
        io_limit: (!def.time_based || def.runtime.is_none()).then_some(size),
        idle_fds: def.disks as usize - 1,
        max_batch: def
            .batch_submit
            .map(|n| if n == 0 { def.iodepth } else { n } as usize),
        fua: def.fua,
    };
    let iothreads = def.iothreads.max(1) as usize;
    if let Some(t) = targets.iter().find(|t| t.size / def.bs < iothreads as u64) {
        return Err(failed(format!(
            "{} holds {} blocks of bs={}, fewer than iothreads={iothreads}",
            t.path.display(),
            t.size / def.bs,
            def.bs
        )));
    }
    let results: Vec<io::Result<JobResult>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for n in 0..def.numjobs as usize {
            let t = &targets[n % targets.len()];
            for share in shares(def, t.size, iothreads) {
                let (file, spec) = (t.file.clone(), share.apply(spec(share.len())));
                let thread = std::thread::Builder::new()
                    .name(format!("{}.{n}.iothread{}", def.name, share.index))
                    .spawn_scoped(s, move || {
                        // Before the engine: its threads start from this one and keep its CPUs.
                        if let Some(cpus) = clone_cpus(def, n) {
                            crate::cpus::pin_to(&cpus).map_err(io::Error::other)?;
                        }
                        let monitor = fdmon.build()?;
                        let engine = engine.build(&options)?;
                        run_job_in(monitor, engine, &file, share.region, spec)
                    });
                handles.push(thread.map_err(|e| failed(format!("starting a thread: {e}")))?);
            }
        }
        Ok::<_, RunError>(
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("a job thread panicked")))
                })
                .collect(),
        )
    })?;
    let mut merged: Option<JobResult> = None;
    for r in results {
        let r = r.map_err(|e| failed(e.to_string()))?;
        match &mut merged {
            Some(m) => m.merge(&r),
            None => merged = Some(r),
        }
    }
    Ok(JobReport {
        def: def.clone(),
        engine,
        fdmon,
        file: targets[0].path.clone(),
        result: merged.expect("numjobs >= 1"),
    })
}

#[cfg(test)]
mod tests;
