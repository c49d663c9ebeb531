//! Running fio job files (`aio-bench run`) and reporting like fio does.
//!
//! This module owns what happens between a parsed [`JobFile`] and its report: the target file
//! of each job (an existing file or device used as it is, or an image created for the run and
//! removed afterwards), the choice of backends (`auto` resolved by the probe order), the
//! `numjobs` clones (each its own thread, loop and engine, reported together like fio's
//! `group_reporting`), the `iothreads=` shares of each clone (each its own thread, loop and
//! engine, in its own region of the file, reported together too), and the two output formats: fio's text summary and fio's JSON field
//! names (`jobs[].jobname`, `read` / `write` / `trim` with `io_bytes`, `bw_bytes`, `iops`,
//! `lat_ns` and `clat_ns` with `percentile` keyed like `"99.000000"`). A trim job's engine is
//! paired with the thread pool for the discards it cannot run
//! ([`EngineKind::build_for`]).
//!
//! Latency here is submit-to-completion as the application sees it: fio's `lat_ns`. `clat_ns`
//! carries the same figures (our engines do not time submission separately), and there is no
//! `slat_ns`.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use aio_core::engine::IoFile;
use aio_core::LoopCounters;
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use crate::engines::{EngineKind, UringOptions};
use crate::image::DiskImage;
use crate::job::{run_job_in, IoStats, JobResult, JobSpec};
use crate::jobfile::{JobDef, JobFile, MonitorChoice};
use crate::monitors::{self, MonitorKind};

/// The percentiles fio reports by default, as fractions.
const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

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

fn target(def: &JobDef, clone: u64) -> Result<Target, RunError> {
    let dir = def.directory.clone().unwrap_or_else(|| PathBuf::from("."));
    let path = match &def.filename {
        Some(f) if f.is_absolute() => f.clone(),
        Some(f) => dir.join(f),
        // fio's default name: jobname.jobnumber.filenumber.
        None => dir.join(format!("{}.{clone}.0", def.name)),
    };
    let fail = |reason: String| RunError::Target {
        job: def.name.clone(),
        line: def.line,
        path: path.display().to_string(),
        reason,
    };
    let writes = def.rw.modifies(def.rwmixread);
    if writes && !def.allow_mounted_write {
        if let Some(reason) = crate::mounted::in_use(&path, "allow_mounted_write") {
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
        let size = def.size.unwrap_or(len);
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

/// The engine and monitor a job runs on.
fn backends(def: &JobDef) -> Result<(EngineKind, MonitorKind), RunError> {
    let fdmon = match def.fdmon {
        MonitorChoice::Kind(k) => k,
        MonitorChoice::Auto => {
            monitors::auto()
                .map_err(|e| RunError::Run {
                    job: def.name.clone(),
                    line: def.line,
                    reason: e.to_string(),
                })?
                .0
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
    aio_core::process::raise_fd_limit();
    let (engine, fdmon) = backends(def)?;
    let failed = |reason: String| RunError::Run {
        job: def.name.clone(),
        line: def.line,
        reason,
    };
    let uring = UringOptions {
        register_files: def.register_files,
        fixed_buffers: if def.fixed_bufs {
            def.iodepth as u32
        } else {
            0
        },
        task_run: def.uring_task_run,
    };
    uring.check_for(engine).map_err(failed)?;
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
                        let monitor = fdmon.build()?;
                        let engine = engine.build_for(uring, def.rw.is_trim())?;
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

/// Runs every job of `file` in order (fio's default: jobs in one file run in parallel unless
/// `stonewall`; here they run one after another so that each measures the machine alone),
/// calling `started` before each.
pub fn run_file(
    file: &JobFile,
    mut started: impl FnMut(&JobDef),
) -> Result<Vec<JobReport>, RunError> {
    file.jobs
        .iter()
        .map(|def| {
            started(def);
            run_one(def)
        })
        .collect()
}

fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// fio's text summary of `reports`.
pub fn to_normal(reports: &[JobReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let d = &r.def;
        let _ = writeln!(
            out,
            "{}: (groupid=0, jobs={}): err= {}: rw={}, bs={}, iodepth={}, engine={}, fdmon={}, disks={}, iothreads={}, poll_max_ns={}, file={}",
            d.name,
            d.numjobs,
            r.result.first_errno.unwrap_or(0),
            d.rw,
            d.bs,
            d.iodepth,
            r.engine,
            r.fdmon,
            d.disks,
            d.iothreads,
            d.poll_max_ns,
            r.file.display()
        );
        let ms = r.result.elapsed.as_millis();
        let sides = [
            ("read", &r.result.read),
            ("write", &r.result.write),
            ("trim", &r.result.trim),
        ];
        for (side, st) in sides {
            if st.ios == 0 {
                continue;
            }
            let secs = r.result.elapsed.as_secs_f64();
            let h = &st.latency_ns;
            let _ = writeln!(
                out,
                "  {side}: IOPS={}, BW={:.1}MiB/s ({:.1}MB/s)({:.1}MiB/{ms}msec)",
                si(st.ios as f64 / secs),
                st.bytes as f64 / secs / (1 << 20) as f64,
                st.bytes as f64 / secs / 1e6,
                st.bytes as f64 / (1 << 20) as f64,
            );
            let _ = writeln!(
                out,
                "    lat (usec): min={:.1}, max={:.1}, avg={:.2}, stdev={:.2}",
                h.min() as f64 / 1e3,
                h.max() as f64 / 1e3,
                h.mean() / 1e3,
                h.stdev() / 1e3
            );
            let _ = write!(out, "    lat percentiles (usec):");
            for (i, p) in PERCENTILES.iter().enumerate() {
                if i % 4 == 0 {
                    let _ = write!(out, "\n     |");
                }
                let _ = write!(
                    out,
                    " {p:5.2}th=[{:>6.1}],",
                    h.value_at_quantile(p / 100.0) as f64 / 1e3
                );
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "  cpu          : loop threads {:.1}% of one CPU",
            100.0 * r.result.iothread_cpu_s / r.result.wall_s.max(1e-9)
        );
        out.push('\n');
    }
    out
}

fn lat_json(h: &Histogram<u64>, with_percentiles: bool) -> Value {
    let mut v = json!({
        "min": if h.is_empty() { 0 } else { h.min() },
        "max": h.max(),
        "mean": h.mean(),
        "stddev": h.stdev(),
        "N": h.len(),
    });
    if with_percentiles && !h.is_empty() {
        let pct: Map<String, Value> = PERCENTILES
            .iter()
            .map(|p| (format!("{p:.6}"), json!(h.value_at_quantile(p / 100.0))))
            .collect();
        v["percentile"] = Value::Object(pct);
    }
    v
}

fn side_json(st: &IoStats, elapsed: Duration) -> Value {
    let secs = elapsed.as_secs_f64();
    json!({
        "io_bytes": st.bytes,
        "io_kbytes": st.bytes / 1024,
        "bw_bytes": (st.bytes as f64 / secs) as u64,
        "bw": (st.bytes as f64 / secs / 1024.0) as u64,
        "iops": st.ios as f64 / secs,
        "runtime": elapsed.as_millis() as u64,
        "total_ios": st.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "lat_ns": lat_json(&st.latency_ns, true),
        "clat_ns": lat_json(&st.latency_ns, true),
    })
}

/// Every loop counter of a job, by its field name: why a figure is what it is.
pub fn counters_json(k: &LoopCounters) -> Value {
    Value::Object(
        k.named()
            .into_iter()
            .map(|(name, v)| (name.to_string(), json!(v)))
            .collect(),
    )
}

/// fio's JSON output (`--output-format=json`) for `reports`.
pub fn to_fio_json(reports: &[JobReport]) -> Value {
    let jobs: Vec<Value> = reports
        .iter()
        .map(|r| {
            let d = &r.def;
            json!({
                "jobname": d.name,
                "groupid": 0,
                "error": r.result.first_errno.unwrap_or(0),
                "job options": {
                    "rw": d.rw.fio_name(),
                    "bs": d.bs.to_string(),
                    "iodepth": d.iodepth.to_string(),
                    "numjobs": d.numjobs.to_string(),
                    "ioengine": r.engine.fio_ioengine(),
                    "sync": if d.fua { "dsync" } else { "none" },
                },
                "read": side_json(&r.result.read, r.result.elapsed),
                "write": side_json(&r.result.write, r.result.elapsed),
                "trim": side_json(&r.result.trim, r.result.elapsed),
                "job_runtime": r.result.elapsed.as_millis() as u64,
                "aio-bench": {
                    "engine": r.engine.name(),
                    "fdmon": r.fdmon.name(),
                    "disks": d.disks,
                    "iothreads": d.iothreads,
                    "poll_max_ns": d.poll_max_ns,
                    "file": r.file.display().to_string(),
                    "errors": r.result.errors,
                    "iothread_cpu_s": r.result.iothread_cpu_s,
                    "counters": counters_json(&r.result.counters),
                },
            })
        })
        .collect();
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({
        "fio version": format!("aio-bench-{}", env!("CARGO_PKG_VERSION")),
        "timestamp": timestamp,
        "jobs": jobs,
    })
}

#[cfg(test)]
mod tests;
