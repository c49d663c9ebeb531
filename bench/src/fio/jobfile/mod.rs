//! fio job files: the parser behind `aio-bench run JOBFILE`.
//!
//! This module owns the job-file syntax and the meaning of each option: `[global]` and named
//! sections, `key=value` lines and bare flags, `;` and `#` comments, fio's size units
//! (`4k` = 4096) and time suffixes. It turns a file into [`JobDef`]s and says exactly what is
//! wrong and on which line otherwise. It runs nothing (that is [`crate::fio::runner`]).
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
//! Of fio's `rw=` modes it runs all but `trimwrite` and `randtrimwrite`: `trim` and `randtrim`
//! discard `bs`-sized blocks (a file's blocks are freed with `fallocate(PUNCH_HOLE)`, a block
//! device gets `BLKDISCARD`). fio has no write-zeroes mode, so neither has this grammar.
//! `sync=1` (also `sync` and `dsync`) makes every write a FUA write (`RWF_DSYNC`).
//!
//! This project adds six keys: `fdmon=` (an fd monitor, or `auto`), `disks=` (fd-monitored
//! idle disks next to the job's file, as in the matrix), `iothreads=` (the job's requests
//! shared by that many iothreads, each with its own loop and engine: see [`JobDef::iothreads`]),
//! `poll_max_ns=`, `poll_rule=` (`recovering`, the default, or `qemu`: how the polling window
//! adapts) and `uring_taskrun=` (io_uring's task-work mode: `auto`, `signal`, `coop` or
//! `defer`). Of fio's
//! engine-specific options it takes io_uring's `registerfiles` and `fixedbufs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::load::Pattern;
use crate::units::{parse_duration, parse_size};
use aio::{Choice, EngineKind, MonitorKind};
use aio_loop::{PollMaxNs, PollRule};

/// The names `uring_taskrun=` takes (io_uring's task-work modes, `TaskRun`'s names).
pub const URING_TASK_RUN_MODES: [&str; 4] = ["auto", "signal", "coop", "defer"];

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
    /// `rw=` (or `readwrite=`).
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
    /// `sync=`: `1`, `sync` or `dsync` make every write a FUA write (`RWF_DSYNC`: complete
    /// only once the data is on stable storage); `0` or `none` (the default) do not. fio's
    /// `sync=1` opens the file `O_SYNC`, which also flushes metadata; for a file written in
    /// place, as jobs here do, that is the same guarantee.
    pub fua: bool,
    /// `ioengine=`, mapped to ours (fio's default `psync` is the pool).
    pub engine: EngineKind,
    /// `fdmon=` (default `auto`).
    pub fdmon: Choice<MonitorKind>,
    /// `disks=` (default 1: the job's file only).
    pub disks: u64,
    /// `iothreads=` (default 1, at most `iodepth`): each clone of the job runs on this many
    /// iothreads, each a thread with its own loop and engine, as a VMM spreads one disk's
    /// queues over several iothreads. Iothread `t` keeps its share of `iodepth` in flight
    /// (`iodepth / iothreads`, one more for the first `iodepth % iothreads`) in its own
    /// `1 / iothreads` region of the file (without `time_based`, it does that region's bytes:
    /// the clone does `size` in all), and registers the idle disks `i` (of `disks=`) with
    /// `i % iothreads == t`. The figures of all iothreads are reported together, as clones
    /// are.
    pub iothreads: u64,
    /// `poll_max_ns=` (default 32768, QEMU's IOThread default).
    pub poll_max_ns: PollMaxNs,
    /// `poll_rule=` (`recovering`, the default, or `qemu`).
    pub poll_rule: PollRule,
    /// `uring_taskrun=`: io_uring's task-work mode, one of [`URING_TASK_RUN_MODES`] (default
    /// `auto`); the io_uring engine takes it as its `TaskRun` of the same name.
    pub uring_task_run: &'static str,
    /// `iodepth_batch_submit=` (alias `iodepth_batch`): the engine's largest batch per
    /// submission call; 0 means `iodepth`, as in fio. Unset, the engine's own default (32)
    /// applies (fio's default is 1).
    pub batch_submit: Option<u64>,
    /// `registerfiles` (fio's io_uring option): register the file with the ring.
    pub register_files: bool,
    /// `fixedbufs` (fio's io_uring option): registered buffers, one slot per `iodepth`.
    pub fixed_bufs: bool,
    /// `pool_spin=` (ours; default 0): how long a thread-pool worker that finished its job
    /// waits, yielding the CPU, for the next before it sleeps (`aio_pool::PoolConfig::spin`).
    /// psync-family engines only.
    pub pool_spin: Duration,
    /// `cpus_allowed=` (fio's CPU list, `0-1,3`): the CPUs the job's threads run on (its
    /// engine's threads too: a thread pool's workers are started by the job's thread and
    /// inherit its CPUs). None: wherever the scheduler puts them.
    pub cpus_allowed: Option<Vec<usize>>,
    /// `cpus_allowed_policy=split` (fio's): clone `n` of the job runs on the `n`-th CPU of
    /// `cpus_allowed` alone (modulo their count); `shared` (the default): every clone on all
    /// of them.
    pub cpus_split: bool,
    /// `allow_mounted_write=1` (fio's): write to a block device even while it is in use
    /// (mounted, holding a mounted partition, device-mapper, swap). Off, such a job is refused
    /// ([`crate::targets::mounted`]).
    pub allow_mounted_write: bool,
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
            fua: false,
            engine: EngineKind::Pool,
            fdmon: Choice::Auto,
            disks: 1,
            iothreads: 1,
            poll_max_ns: PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
            poll_rule: PollRule::default(),
            uring_task_run: URING_TASK_RUN_MODES[0],
            batch_submit: None,
            register_files: false,
            fixed_bufs: false,
            pool_spin: Duration::ZERO,
            cpus_allowed: None,
            cpus_split: false,
            allow_mounted_write: false,
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

mod bookkeeping;
use bookkeeping::BOOKKEEPING;

/// The most buffer memory one job may ask for (`bs x iodepth x numjobs`).
const MAX_BUFFER_BYTES: u64 = 1 << 30;

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

/// `s` with its control characters escaped (`\u{7}`, `\t`), so that an error shows what
/// the file holds instead of a terminal swallowing it.
fn escape_controls(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Parses `text` (named `path` in errors).
pub fn parse(text: &str, path: &Path) -> Result<JobFile, JobFileError> {
    let shown = path.display().to_string();
    let syntax = |line: usize, message: String| JobFileError::Syntax {
        path: shown.clone(),
        line,
        message: escape_controls(&message),
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
        if job.iothreads > job.iodepth {
            return Err(syntax(
                line,
                format!(
                    "job '{}': iothreads={} is more than iodepth={}: each iothread keeps at least one request in flight",
                    job.name, job.iothreads, job.iodepth
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
        key: escape_controls(s.key),
        value: escape_controls(s.value.unwrap_or("")),
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
            if matches!(
                v.to_ascii_lowercase().as_str(),
                "trimwrite" | "randtrimwrite"
            ) {
                return Err(bad(
                    "fio's trimwrite and randtrimwrite (a trim before each write) are not supported"
                        .into(),
                ));
            }
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
        "sync" => {
            job.fua = match needs_value()?.to_ascii_lowercase().as_str() {
                "1" | "sync" | "dsync" => true,
                "0" | "none" => false,
                _ => return Err(bad("expected none, 0, 1, sync or dsync".into())),
            }
        }
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
            job.fdmon = match v.parse::<Choice<MonitorKind>>() {
                Ok(choice) => choice,
                Err(_) if v == "shared-ring" => {
                    return Err(bad("shared-ring pairs the monitor with the io_uring \
                                    engine: vs-fio and aio-peers only"
                        .into()))
                }
                Err(e) => return Err(bad(format!("{e}, or auto"))),
            };
        }
        "pool_spin" => job.pool_spin = duration()?,
        "cpus_allowed" => {
            let list: crate::cpus::CpuList =
                needs_value()?.parse().map_err(|e| bad(format!("{e}")))?;
            job.cpus_allowed = Some(list.as_slice().to_vec());
        }
        "cpus_allowed_policy" => {
            job.cpus_split = match needs_value()? {
                "split" => true,
                "shared" => false,
                _ => return Err(bad("expected shared or split".into())),
            }
        }
        "disks" => job.disks = count(1, 256)?,
        "iothreads" => job.iothreads = count(1, 64)?,
        "poll_max_ns" => {
            let v = needs_value()?;
            // The command line's rule (`units::parse_poll_max_ns`), in a job file's words.
            job.poll_max_ns = match crate::units::parse_poll_max_ns(v) {
                Ok(p) => p,
                Err(crate::units::UnitError::PollMaxNsTooLong(_)) => {
                    return Err(bad("expected at most 1000000000 ns, or auto".into()))
                }
                Err(e) => return Err(bad(e.to_string())),
            };
        }
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
        "allow_mounted_write" => job.allow_mounted_write = flag()?,
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
                key: escape_controls(s.key),
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
