//! fio job files: the parser behind `aio-bench run JOBFILE`.
//!
//! This module owns the job-file syntax and the meaning of each option: `[global]` and named
//! sections, `key=value` lines and bare flags, `;` and `#` comments, fio's size units
//! (`4k` = 4096) and time suffixes. It turns a file into [`JobDef`]s and says exactly what is
//! wrong and on which line otherwise. It runs nothing (that is [`crate::runner`]).
//!
//! Rules, as fio has them:
//!
//! * a `[global]` section's options apply to every job section after it (a later `[global]`
//!   adds to them for the jobs that follow);
//! * options before the first section are an error;
//! * options that only change fio's own bookkeeping (`gtod_reduce`, `clocksource`,
//!   `group_reporting`, `thread`, `norandommap`, `randrepeat`, `invalidate`, ...) are accepted
//!   and listed in [`JobFile::notes`];
//! * anything else unknown is an error naming the file and the line.
//!
//! This project adds five keys: `fdmon=` (an fd monitor, or `auto`), `disks=` (fd-monitored
//! idle disks next to the job's file, as in the matrix), `poll_max_ns=`, `poll_rule=`
//! (`recovering`, the default, or `qemu`: how the polling window adapts) and `uring_taskrun=`
//! (io_uring's task-work mode: `auto`, `signal`, `coop` or `defer`). Of fio's
//! engine-specific options it takes io_uring's `registerfiles` and `fixedbufs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engines::{EngineKind, URING_TASK_RUN_MODES};
use crate::job::Pattern;
use crate::monitors::MonitorKind;
use crate::units::{parse_duration, parse_size};
use aio_core::PollRule;

/// The fd monitor a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonitorChoice {
    /// What [`crate::monitors::auto`] picks on this kernel.
    Auto,
    /// This one.
    Kind(MonitorKind),
}

/// One job, with `[global]` applied.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDef {
    /// The section name (fio's `jobname`).
    pub name: String,
    /// The line of the section header.
    pub line: usize,
    /// `filename=`.
    pub filename: Option<PathBuf>,
    /// `directory=`.
    pub directory: Option<PathBuf>,
    /// `size=`: the file's size, and without `time_based` the I/O each job does.
    pub size: Option<u64>,
    /// `rw=`.
    pub rw: Pattern,
    /// `rwmixread=` (or 100 - `rwmixwrite=`); fio's default is 50.
    pub rwmixread: u8,
    /// `bs=` (fio's default 4k).
    pub bs: u64,
    /// `iodepth=` (default 1).
    pub iodepth: u64,
    /// `numjobs=` (default 1): clones of the job, each its own thread, loop and engine.
    pub numjobs: u64,
    /// `runtime=`.
    pub runtime: Option<Duration>,
    /// `time_based`: run for `runtime` even when `size` is done.
    pub time_based: bool,
    /// `ramp_time=`.
    pub ramp: Duration,
    /// `direct=` (default 0, as fio; this project's engines want 1).
    pub direct: bool,
    /// `ioengine=`, mapped to ours (fio's default `psync` is the pool).
    pub engine: EngineKind,
    /// `fdmon=` (default `auto`).
    pub fdmon: MonitorChoice,
    /// `disks=` (default 1: the job's file only).
    pub disks: u64,
    /// `poll_max_ns=` (default 32768, QEMU's IOThread default).
    pub poll_max_ns: u64,
    /// `poll_rule=` (`recovering`, the default, or `qemu`).
    pub poll_rule: PollRule,
    /// `uring_taskrun=`: io_uring's task-work mode, one of
    /// [`crate::engines::URING_TASK_RUN_MODES`] (default `auto`).
    pub uring_task_run: &'static str,
    /// `iodepth_batch_submit=` (alias `iodepth_batch`): the engine's largest batch per
    /// submission call; 0 means `iodepth`, as in fio. Unset, the engine's own default (32)
    /// applies (fio's default is 1).
    pub batch_submit: Option<u64>,
    /// `registerfiles` (fio's io_uring option): register the file with the ring.
    pub register_files: bool,
    /// `fixedbufs` (fio's io_uring option): registered buffers, one slot per `iodepth`.
    pub fixed_bufs: bool,
}

impl JobDef {
    fn defaults(name: String, line: usize) -> JobDef {
        JobDef {
            name,
            line,
            filename: None,
            directory: None,
            size: None,
            rw: Pattern::Read,
            rwmixread: 50,
            bs: 4096,
            iodepth: 1,
            numjobs: 1,
            runtime: None,
            time_based: false,
            ramp: Duration::ZERO,
            direct: false,
            engine: EngineKind::Pool,
            fdmon: MonitorChoice::Auto,
            disks: 1,
            poll_max_ns: 32_768,
            poll_rule: PollRule::default(),
            uring_task_run: URING_TASK_RUN_MODES[0],
            batch_submit: None,
            register_files: false,
            fixed_bufs: false,
        }
    }
}

/// A parsed job file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFile {
    /// Where it came from.
    pub path: PathBuf,
    /// The jobs, in file order.
    pub jobs: Vec<JobDef>,
    /// Options accepted without effect, one line each (`file:line: key ...`).
    pub notes: Vec<String>,
}

/// What is wrong with a job file. Every variant but `Read` names the line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JobFileError {
    /// The file could not be read.
    #[error("{path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// A line that is not a section, an option or a comment.
    #[error("{path}:{line}: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// An option this project does not know.
    #[error("{path}:{line}: unknown option '{key}'")]
    UnknownOption {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// The option.
        key: String,
    },
    /// A known option with a value that does not fit.
    #[error("{path}:{line}: {key}={value}: {reason}")]
    BadValue {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// The option.
        key: String,
        /// Its value.
        value: String,
        /// Why it does not fit.
        reason: String,
    },
    /// A file with no job section.
    #[error("{path}:{line}: no job section (a [name] other than [global])")]
    NoJobs {
        /// The file.
        path: String,
        /// The last line (where a job was expected by).
        line: usize,
    },
}

impl JobFileError {
    /// The line the error is about, if it is about one.
    pub fn line(&self) -> Option<usize> {
        match self {
            JobFileError::Read { .. } => None,
            JobFileError::Syntax { line, .. }
            | JobFileError::UnknownOption { line, .. }
            | JobFileError::BadValue { line, .. }
            | JobFileError::NoJobs { line, .. } => Some(*line),
        }
    }
}

impl From<JobFileError> for std::io::Error {
    fn from(e: JobFileError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// The most buffer memory one job may ask for (`bs x iodepth x numjobs`).
const MAX_BUFFER_BYTES: u64 = 1 << 30;

/// fio options that only change fio's own bookkeeping or reporting: accepted, noted, ignored.
const BOOKKEEPING: &[&str] = &[
    "gtod_reduce",
    "clocksource",
    "group_reporting",
    "thread",
    "norandommap",
    "randrepeat",
    "invalidate",
    "description",
    "disable_lat",
    "disable_clat",
    "disable_slat",
    "disable_bw_measurement",
    "clat_percentiles",
    "lat_percentiles",
    "slat_percentiles",
    "percentile_list",
    "unified_rw_reporting",
    "new_group",
    "stonewall",
    "wait_for_previous",
    "exitall",
    "refill_buffers",
    "scramble_buffers",
    "fallocate",
    "allrandrepeat",
    "randseed",
    "use_os_rand",
    "per_job_logs",
    "log_avg_msec",
    "significant_figures",
    "lockmem",
    "cpus_allowed_policy",
    "ioscheduler",
    "create_on_open",
    "fadvise_hint",
];

/// Reads and parses `path`.
pub fn load(path: &Path) -> Result<JobFile, JobFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| JobFileError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(&text, path)
}

/// One option as written, with where it was.
struct Setting<'a> {
    line: usize,
    key: &'a str,
    value: Option<&'a str>,
}

/// Parses `text` (named `path` in errors).
pub fn parse(text: &str, path: &Path) -> Result<JobFile, JobFileError> {
    let shown = path.display().to_string();
    let syntax = |line: usize, message: String| JobFileError::Syntax {
        path: shown.clone(),
        line,
        message,
    };
    let mut global: Vec<Setting<'_>> = Vec::new();
    // (name, header line, global settings in force, own settings)
    let mut sections: Vec<(String, usize, usize, Vec<Setting<'_>>)> = Vec::new();
    let mut in_global = false;
    let mut seen_section = false;
    let mut last_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        last_line = line;
        let t = raw.trim();
        if t.is_empty() || t.starts_with(';') || t.starts_with('#') {
            continue;
        }
        if let Some(rest) = t.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                return Err(syntax(
                    line,
                    format!("section header '{t}' has no closing ']'"),
                ));
            };
            let name = name.trim();
            if name.is_empty() || name.contains(['[', ']']) {
                return Err(syntax(line, format!("'{t}' is not a section name")));
            }
            seen_section = true;
            in_global = name == "global";
            if !in_global {
                sections.push((name.to_string(), line, global.len(), Vec::new()));
            }
            continue;
        }
        if !seen_section {
            return Err(syntax(
                line,
                format!("option '{t}' before the first [section]"),
            ));
        }
        let (key, value) = match t.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (t, None),
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(syntax(line, format!("'{t}' is not key=value or a flag")));
        }
        let setting = Setting { line, key, value };
        if in_global {
            // Checked now, so that a [global] after the last job is checked too.
            apply(
                &mut JobDef::defaults(String::new(), line),
                &setting,
                &shown,
                &mut Vec::new(),
            )?;
            global.push(setting);
        } else {
            sections.last_mut().expect("a job section").3.push(setting);
        }
    }
    if sections.is_empty() {
        return Err(JobFileError::NoJobs {
            path: shown,
            line: last_line.max(1),
        });
    }
    let mut notes = Vec::new();
    let mut jobs = Vec::with_capacity(sections.len());
    for (name, line, globals, own) in sections {
        let mut job = JobDef::defaults(name, line);
        for s in global[..globals].iter().chain(&own) {
            apply(&mut job, s, &shown, &mut notes)?;
        }
        let buffers = job.bs * job.iodepth * job.numjobs;
        if buffers > MAX_BUFFER_BYTES {
            return Err(syntax(
                line,
                format!(
                    "job '{}': bs x iodepth x numjobs = {buffers} bytes of buffers, more than the {} MiB this tool allows",
                    job.name,
                    MAX_BUFFER_BYTES >> 20
                ),
            ));
        }
        jobs.push(job);
    }
    // A [global] option is noted once, not once per job.
    let mut seen = std::collections::HashSet::new();
    notes.retain(|n| seen.insert(n.clone()));
    Ok(JobFile {
        path: path.to_path_buf(),
        jobs,
        notes,
    })
}

/// Applies one option to `job`.
fn apply(
    job: &mut JobDef,
    s: &Setting<'_>,
    path: &str,
    notes: &mut Vec<String>,
) -> Result<(), JobFileError> {
    let key = s.key.to_ascii_lowercase();
    let bad = |reason: String| JobFileError::BadValue {
        path: path.to_string(),
        line: s.line,
        key: s.key.to_string(),
        value: s.value.unwrap_or("").to_string(),
        reason,
    };
    let needs_value = || {
        s.value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad("needs a value".into()))
    };
    let size = || needs_value().and_then(|v| parse_size(v).map_err(|e| bad(e.to_string())));
    let duration = || needs_value().and_then(|v| parse_duration(v).map_err(|e| bad(e.to_string())));
    let count = |min: u64, max: u64| {
        needs_value().and_then(|v| {
            let n = parse_size(v).map_err(|e| bad(e.to_string()))?;
            if (min..=max).contains(&n) {
                Ok(n)
            } else {
                Err(bad(format!("must be in {min}..={max}")))
            }
        })
    };
    // A flag: bare, or =0 / =1 (fio also takes true/false).
    let flag = || match s.value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("1") | Some("true") => Ok(true),
        Some("0") | Some("false") => Ok(false),
        Some(_) => Err(bad("expected 0 or 1".into())),
    };
    match key.as_str() {
        "filename" => job.filename = Some(PathBuf::from(needs_value()?)),
        "directory" => job.directory = Some(PathBuf::from(needs_value()?)),
        "size" => job.size = Some(count(1, u64::MAX)?),
        "rw" | "readwrite" => {
            let v = needs_value()?;
            // fio allows `rw=randread:8` (an offset modifier); we do not.
            job.rw = v.to_ascii_lowercase().parse::<Pattern>().map_err(bad)?;
        }
        "rwmixread" => job.rwmixread = count(0, 100)? as u8,
        "rwmixwrite" => job.rwmixread = 100 - count(0, 100)? as u8,
        "bs" | "blocksize" => {
            let bs = size()?;
            if bs == 0 || bs % 512 != 0 || bs > 64 << 20 {
                return Err(bad(
                    "must be a non-zero multiple of 512 up to 64m (O_DIRECT)".into(),
                ));
            }
            job.bs = bs;
        }
        "iodepth" => job.iodepth = count(1, 4096)?,
        "numjobs" => job.numjobs = count(1, 64)?,
        "runtime" | "timeout" => job.runtime = Some(duration()?),
        "time_based" => job.time_based = flag()?,
        "ramp_time" => job.ramp = duration()?,
        "direct" => job.direct = flag()?,
        "buffered" => job.direct = !flag()?,
        "ioengine" => {
            let v = needs_value()?.to_ascii_lowercase();
            job.engine = match v.as_str() {
                "libaio" => EngineKind::LinuxAio,
                "io_uring" => EngineKind::Uring,
                "psync" | "pvsync" | "pvsync2" | "sync" | "posixaio" => EngineKind::Pool,
                _ => {
                    return Err(bad(
                        "expected libaio, io_uring, psync, pvsync, pvsync2, sync or posixaio"
                            .into(),
                    ))
                }
            };
        }
        "fdmon" => {
            let v = needs_value()?;
            job.fdmon = if v == "auto" {
                MonitorChoice::Auto
            } else {
                MonitorChoice::Kind(
                    v.parse::<MonitorKind>()
                        .map_err(|e| bad(format!("{e}, or auto")))?,
                )
            };
        }
        "disks" => job.disks = count(1, 256)?,
        "poll_max_ns" => job.poll_max_ns = count(0, 1_000_000_000)?,
        "poll_rule" => {
            job.poll_rule = match needs_value()? {
                "recovering" => PollRule::Recovering,
                "qemu" => PollRule::Qemu,
                _ => return Err(bad("expected recovering or qemu".into())),
            }
        }
        "uring_taskrun" => {
            let v = needs_value()?;
            job.uring_task_run = URING_TASK_RUN_MODES
                .into_iter()
                .find(|m| *m == v)
                .ok_or_else(|| bad(format!("expected {}", URING_TASK_RUN_MODES.join(", "))))?;
        }
        // fio: 0 means "iodepth".
        "iodepth_batch_submit" | "iodepth_batch" => job.batch_submit = Some(count(0, 4096)?),
        // fio's io_uring engine options (an error at run time with another engine).
        "registerfiles" => job.register_files = flag()?,
        "fixedbufs" => job.fixed_bufs = flag()?,
        // Sizes here are binary (4k = 4096): fio's default, the only base accepted.
        "kb_base" => {
            if needs_value()? != "1024" {
                return Err(bad("only kb_base=1024 (fio's default) is supported".into()));
            }
        }
        k if BOOKKEEPING.contains(&k) => {
            notes.push(format!(
                "{path}:{}: '{}' only changes fio's bookkeeping; ignored",
                s.line, s.key
            ));
        }
        _ => {
            return Err(JobFileError::UnknownOption {
                path: path.to_string(),
                line: s.line,
                key: s.key.to_string(),
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Rng;

    fn p(text: &str) -> Result<JobFile, JobFileError> {
        parse(text, Path::new("t.fio"))
    }

    /// The fio job file posted with QEMU's linux-aio patch "Cancel BH if not needed" (direct
    /// completion processing, a bottom half only as the nested-loop safety net), unchanged.
    const POSTED_LINUX_AIO_JOB: &str = "[global]
filename=/dev/vdb
ioengine=libaio
direct=1
runtime=60
ramp_time=5
gtod_reduce=1

[job1]
numjobs=4
iodepth=16
rw=randread
bs=4K
";

    #[test]
    fn the_job_file_posted_with_the_linux_aio_patch_parses() {
        let f = p(POSTED_LINUX_AIO_JOB).unwrap();
        assert_eq!(f.jobs.len(), 1);
        let j = &f.jobs[0];
        assert_eq!(j.name, "job1");
        assert_eq!(j.line, 9);
        assert_eq!(j.filename.as_deref(), Some(Path::new("/dev/vdb")));
        assert_eq!(j.engine, EngineKind::LinuxAio);
        assert!(j.direct && !j.time_based);
        assert_eq!(j.runtime, Some(Duration::from_secs(60)));
        assert_eq!(j.ramp, Duration::from_secs(5));
        assert_eq!((j.numjobs, j.iodepth, j.bs), (4, 16, 4096));
        assert_eq!(j.rw, Pattern::RandRead);
        assert_eq!(f.notes.len(), 1);
        assert!(f.notes[0].contains("t.fio:7") && f.notes[0].contains("gtod_reduce"));
        let two = p(&format!("{POSTED_LINUX_AIO_JOB}[job2]\n")).unwrap();
        assert_eq!(
            two.notes, f.notes,
            "a [global] note is given once, not per job"
        );
    }

    #[test]
    fn globals_apply_to_later_jobs_only_and_jobs_override_them() {
        let f = p("; comment\n# another\n[global]\nbs=8k\n[a]\nbs=16k\n[b]\n[global]\niodepth=4\n[c]\nrw=randrw\nrwmixwrite=30\ntime_based\nfdmon=epoll\ndisks=64\npoll_max_ns=0\n")
            .unwrap();
        let [a, b, c] = &f.jobs[..] else {
            panic!("three jobs")
        };
        assert_eq!((a.bs, a.iodepth), (16384, 1));
        assert_eq!((b.bs, b.iodepth), (8192, 1));
        assert_eq!((c.bs, c.iodepth), (8192, 4));
        assert_eq!(
            (c.rw, c.rwmixread, c.time_based),
            (Pattern::RandReadWrite, 70, true)
        );
        assert_eq!(c.fdmon, MonitorChoice::Kind(MonitorKind::Epoll));
        assert_eq!((c.disks, c.poll_max_ns), (64, 0));
    }

    #[test]
    fn the_shipped_job_files_parse() {
        let f = p(include_str!("../jobs/uring-registered.fio")).unwrap();
        let opts: Vec<_> = f
            .jobs
            .iter()
            .map(|j| (j.register_files, j.fixed_bufs))
            .collect();
        assert_eq!(
            opts[..4],
            [(false, false), (true, false), (false, true), (true, true)]
        );
        let f = p(include_str!("../jobs/uring-vs-linux-aio.fio")).unwrap();
        assert_eq!(f.jobs.len(), 8);
        assert!(f.jobs.iter().all(|j| j.direct && j.time_based));
        let engines: Vec<_> = f.jobs.iter().map(|j| j.engine).collect();
        assert_eq!(
            engines[..4],
            [
                EngineKind::LinuxAio,
                EngineKind::Uring,
                EngineKind::Uring,
                EngineKind::LinuxAio
            ]
        );
    }

    #[test]
    fn iodepth_batch_submit_sets_the_engine_batch() {
        let f = p("[a]\niodepth_batch_submit=8\n[b]\niodepth_batch=0\n[c]\n").unwrap();
        let got: Vec<_> = f.jobs.iter().map(|j| j.batch_submit).collect();
        assert_eq!(got, [Some(8), Some(0), None]);
        assert!(p("[a]\niodepth_batch_submit=5000\n").is_err());
    }

    #[test]
    fn poll_rule_and_uring_taskrun_are_parsed() {
        let f = p("[a]\npoll_rule=qemu\nuring_taskrun=signal\n[b]\n").unwrap();
        assert_eq!(
            (f.jobs[0].poll_rule, f.jobs[0].uring_task_run),
            (PollRule::Qemu, "signal")
        );
        assert_eq!(
            (f.jobs[1].poll_rule, f.jobs[1].uring_task_run),
            (PollRule::Recovering, "auto")
        );
        let e = p("[a]\npoll_rule=fast\n").unwrap_err().to_string();
        assert!(e.contains("recovering or qemu"), "{e}");
        let e = p("[a]\nuring_taskrun=sqpoll\n").unwrap_err().to_string();
        assert!(e.contains("auto, signal, coop, defer"), "{e}");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("bs=4k\n[a]\n", 1, "before the first"),
            ("[a]\nbs=4x\n", 2, "bs=4x"),
            ("[a]\n\nfrobnicate=1\n", 3, "unknown option 'frobnicate'"),
            ("[a\n", 1, "closing"),
            ("[a]\nrw=sideways\n", 2, "rw=sideways"),
            ("[a]\nioengine=spdk\n", 2, "ioengine=spdk"),
            ("[a]\niodepth=0\n", 2, "1..=4096"),
            ("[a]\ndisks=257\n", 2, "1..=256"),
            ("[a]\nbs=1000\n", 2, "multiple of 512"),
            ("[a]\nruntime=soon\n", 2, "duration"),
            ("[a]\nfdmon=kqueue\n", 2, "kqueue"),
            ("[a]\nsize=\n", 2, "needs a value"),
            ("[a]\ndirect=yes\n", 2, "0 or 1"),
            ("[global]\nbs=4k\n", 2, "no job section"),
            ("[a]\nbad key=1\n", 2, "not key=value"),
            (
                "[a]\n[global]\nfrobnicate=1\n",
                3,
                "unknown option 'frobnicate'",
            ),
            ("[a]\nkb_base=1000\n", 2, "kb_base=1024"),
            ("[a]\nbs=64m\niodepth=64\n", 1, "bytes of buffers"),
        ];
        for (text, line, needle) in cases {
            let e = p(text).unwrap_err();
            assert_eq!(e.line(), Some(*line), "{text:?}: {e}");
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("t.fio:{line}:")), "{msg}");
            assert!(msg.contains(needle), "{text:?}: '{msg}' lacks '{needle}'");
        }
    }

    /// Mutation fuzzing: random edits of valid files never panic, and every error names a line
    /// of the file (or the line after its last one).
    #[test]
    fn fuzzed_job_files_never_panic_and_errors_name_a_line() {
        let corpus = [
            POSTED_LINUX_AIO_JOB,
            "[global]\nbs=8k\n[a]\nrw=randrw\nrwmixread=70\ntime_based\nruntime=2s\n",
            "[x]\nsize=1g\nfilename=/tmp/f\nioengine=io_uring\niodepth=32\n",
        ];
        let alphabet: &[u8] = b"[]=;#\n kmgKMGs0123456789abcdefrwxyz_.\xff";
        let mut rng = Rng::new(7);
        let mut errors = 0;
        let cases = 20_000;
        for case in 0..cases {
            let mut bytes = corpus[case % corpus.len()].as_bytes().to_vec();
            for _ in 0..1 + rng.next() % 6 {
                let at = (rng.next() as usize) % (bytes.len() + 1);
                let c = alphabet[(rng.next() as usize) % alphabet.len()];
                match rng.next() % 3 {
                    0 if at < bytes.len() => bytes[at] = c,
                    1 if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, c),
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let lines = text.lines().count().max(1);
            if let Err(e) = p(&text) {
                errors += 1;
                let line = e.line().expect("parse errors name a line");
                assert!((1..=lines).contains(&line), "{e} for {text:?}");
                assert!(e.to_string().starts_with(&format!("t.fio:{line}:")));
            }
        }
        assert!(
            errors > 0 && errors < cases,
            "mutations found both outcomes"
        );
    }
}
