//! Running fio job files (`aio-bench run`) and reporting like fio does.
//!
//! This module owns what happens between a parsed [`JobFile`] and its report: the target file
//! of each job (an existing file or device used as it is, or an image created for the run and
//! removed afterwards), the choice of backends (`auto` resolved by the probe order), the
//! `numjobs` clones (each its own thread, loop and engine, reported together like fio's
//! `group_reporting`), and the two output formats: fio's text summary and fio's JSON field
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
use crate::job::{run_job, IoStats, JobResult, JobSpec};
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

/// Runs one job: its clones in parallel threads, each with its own loop and engine.
pub fn run_one(def: &JobDef) -> Result<JobReport, RunError> {
    // `disks=` registers a notifier per idle disk in each clone's loop.
    aio_core::raise_fd_limit();
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
    let results: Vec<io::Result<JobResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..def.numjobs as usize)
            .map(|n| {
                let t = &targets[n % targets.len()];
                let (file, size) = (t.file.clone(), t.size);
                s.spawn(move || {
                    let monitor = fdmon.build()?;
                    let engine = engine.build_for(uring, def.rw.is_trim())?;
                    run_job(monitor, engine, &file, size, spec(size))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a job thread panicked")))
            })
            .collect()
    });
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
            "{}: (groupid=0, jobs={}): err= {}: rw={}, bs={}, iodepth={}, engine={}, fdmon={}, disks={}, poll_max_ns={}, file={}",
            d.name,
            d.numjobs,
            r.result.first_errno.unwrap_or(0),
            d.rw,
            d.bs,
            d.iodepth,
            r.engine,
            r.fdmon,
            d.disks,
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
mod tests {
    use super::*;
    use crate::jobfile;
    use std::path::Path;

    #[test]
    #[cfg(all(feature = "pool", feature = "poll"))]
    fn a_job_file_runs_and_reports_in_fio_formats() {
        let dir = std::env::temp_dir().join(format!("aio-bench-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "[global]\ndirectory={}\nsize=1m\ndirect=1\nioengine=psync\nfdmon=poll\ngroup_reporting\n\
             [mixed]\nrw=randrw\nrwmixread=75\niodepth=4\nnumjobs=2\ntime_based\nruntime=200ms\ndisks=8\n\
             [sized]\nrw=write\nbs=64k\n",
            dir.display()
        );
        let f = jobfile::parse(&text, Path::new("test.fio")).unwrap();
        let mut started = Vec::new();
        let reports = run_file(&f, |d| started.push(d.name.clone())).unwrap();
        assert_eq!(started, ["mixed", "sized"]);
        let mixed = &reports[0].result;
        assert!(mixed.read.ios > mixed.write.ios && mixed.write.ios > 0);
        assert_eq!(mixed.errors, 0);
        // Without time_based the job does its size (1 MiB) and stops.
        assert_eq!(reports[1].result.write.bytes, 1 << 20);
        assert_eq!(reports[1].result.write.ios, 16);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "files the run created are removed"
        );
        std::fs::remove_dir(&dir).unwrap();

        let text = to_normal(&reports);
        assert!(
            text.contains("mixed: (groupid=0, jobs=2): err= 0"),
            "{text}"
        );
        assert!(text.contains("  read: IOPS=") && text.contains("  write: IOPS="));
        assert!(text.contains("99.00th=["));

        let v = to_fio_json(&reports);
        // What fio-parsing tools read.
        let j = &v["jobs"][0];
        assert_eq!(j["jobname"], "mixed");
        let read = &j["read"];
        assert_eq!(read["io_bytes"].as_u64().unwrap(), mixed.read.bytes);
        assert!(read["bw_bytes"].as_u64().unwrap() > 0);
        assert!(read["iops"].as_f64().unwrap() > 0.0);
        assert!(read["lat_ns"]["mean"].as_f64().unwrap() > 0.0);
        assert!(read["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
        assert!(read["clat_ns"]["percentile"]["50.000000"].as_u64().unwrap() > 0);
        assert_eq!(v["jobs"][1]["write"]["io_bytes"], 1 << 20);
        assert_eq!(v["jobs"][1]["read"]["io_bytes"], 0);
        // fio's own parser in this crate reads it.
        let back = crate::fio::parse(&v.to_string(), &["read"]).unwrap();
        assert!((back.iops - read["iops"].as_f64().unwrap()).abs() < 1e-6);
    }

    #[test]
    fn a_missing_file_without_size_is_an_error_naming_the_job() {
        let f = jobfile::parse(
            "[j]\nfilename=/nonexistent/aio-bench/file\nfdmon=poll\n",
            Path::new("x.fio"),
        )
        .unwrap();
        let e = run_one(&f.jobs[0]).unwrap_err().to_string();
        assert!(
            e.contains("job 'j' (line 1)") && e.contains("no size="),
            "{e}"
        );
    }

    #[test]
    fn io_uring_options_on_another_engine_are_an_error_naming_the_job() {
        let f = jobfile::parse(
            "[j]\nioengine=libaio\nfixedbufs\nsize=1m\nfilename=/nonexistent/aio-bench/f\n",
            Path::new("x.fio"),
        )
        .unwrap();
        let e = run_one(&f.jobs[0]).unwrap_err().to_string();
        assert!(
            e.contains("job 'j' (line 1)") && e.contains("io_uring options"),
            "{e}"
        );
    }
}
