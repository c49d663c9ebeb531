//! One fio-like job against one engine: keep `iodepth` requests in flight on a file for a
//! while and measure IOPS and latency.
//!
//! This module owns the job's spec, its result, and how its requests reach an engine attached
//! to an [`AioContext`]: as an application's would, each request's own completion callback
//! counts it and submits the slot's next request (`submit_with` refill), the loop blocking in
//! `poll`. Which request comes next and what is counted is the bench's load generator's
//! ([`crate::load::generator`]), called from those callbacks. It never reaches into an
//! engine's internals. Reads and writes move `AlignedBuf`s; trims are discards of `bs`-sized
//! blocks and carry no memory.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use aio_core::engine::{AlignedBuf, Completion, IoEngine, IoFile, Request, RwFlags};
use aio_core::{EventLoop, Notifier};
use aio_loop::AttachedEngine;
use aio_loop::{AioContext, FdHandler, LoopCounters, PollMaxNs, PollParams, PollRule};

use crate::cpus::thread_cpu_seconds;
use crate::load::generator::transferred;
use crate::load::{Direction, Generator, Layout, LoadSpec, Pattern, Tally, Window};

/// What a job does.
#[derive(Debug, Clone, Copy)]
pub struct JobSpec {
    /// The pattern.
    pub pattern: Pattern,
    /// Percentage of reads in a mixed pattern (fio's `rwmixread`).
    pub rwmixread: u8,
    /// Block size in bytes (a multiple of 512 for O_DIRECT).
    pub bs: usize,
    /// Requests kept in flight.
    pub iodepth: usize,
    /// Measured time (the job stops at `ramp + runtime` even if `io_limit` is not reached).
    pub runtime: Duration,
    /// Time run before measuring starts.
    pub ramp: Duration,
    /// The loop's adaptive polling limit.
    pub poll_max_ns: PollMaxNs,
    /// How the loop's polling window adapts.
    pub poll_rule: PollRule,
    /// Stop issuing after this many bytes (fio without `time_based`: `size` bytes per job).
    pub io_limit: Option<u64>,
    /// Idle fds registered in the loop next to the job's I/O (the matrix's idle disks: a
    /// doorbell notifier each, with read and poll handlers, that never fires).
    pub idle_fds: usize,
    /// The engine's largest batch per submission (`None`: the engine's default).
    pub max_batch: Option<usize>,
    /// Writes are FUA writes ([`RwFlags::FUA`], `RWF_DSYNC`: done only once on stable
    /// storage), as fio's `sync=1` / `sync=dsync`.
    pub fua: bool,
}

impl JobSpec {
    /// A time-based job: `pattern` in `bs` blocks, `iodepth` in flight, for `runtime`, no ramp,
    /// polling at QEMU's IOThread default, no idle fds.
    pub fn new(pattern: Pattern, bs: usize, iodepth: usize, runtime: Duration) -> JobSpec {
        JobSpec {
            pattern,
            rwmixread: 50,
            bs,
            iodepth,
            runtime,
            ramp: Duration::ZERO,
            poll_max_ns: PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
            poll_rule: PollRule::default(),
            io_limit: None,
            idle_fds: 0,
            max_batch: None,
            fua: false,
        }
    }
}

/// What a job measured.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Reads.
    pub read: Tally,
    /// Writes.
    pub write: Tally,
    /// Trims (discards).
    pub trim: Tally,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// The loop's counters over the whole job.
    pub counters: LoopCounters,
    /// Errors completions reported (and submissions refused).
    pub errors: u64,
    /// The errno of the first error (fio's `err=`), if any.
    pub first_errno: Option<i32>,
    /// CPU time (user + system) of the loop thread over the whole job, in seconds.
    pub iothread_cpu_s: f64,
    /// Wall time of the whole job (ramp included), in seconds.
    pub wall_s: f64,
}

impl JobResult {
    /// Reads, writes and trims together.
    pub fn total(&self) -> Tally {
        let mut t = self.read.clone();
        t.merge(&self.write);
        t.merge(&self.trim);
        t
    }

    /// Completed requests per second, every direction.
    pub fn iops(&self) -> f64 {
        (self.read.ios + self.write.ios + self.trim.ios) as f64 / self.elapsed.as_secs_f64()
    }

    /// MB/s (10^6 bytes per second, as fio's MB/s), every direction (a trim's bytes are
    /// those it discarded).
    pub fn mb_s(&self) -> f64 {
        let bytes = self.read.bytes + self.write.bytes + self.trim.bytes;
        bytes as f64 / 1e6 / self.elapsed.as_secs_f64()
    }

    /// Mean latency in µs, every direction.
    pub fn mean_lat_us(&self) -> f64 {
        self.total().latency_ns.mean() / 1000.0
    }

    /// Adds a parallel clone's results (fio's `numjobs` with `group_reporting`): requests,
    /// errors and CPU add up, the window is the longer one.
    pub fn merge(&mut self, other: &JobResult) {
        self.read.merge(&other.read);
        self.write.merge(&other.write);
        self.trim.merge(&other.trim);
        self.elapsed = self.elapsed.max(other.elapsed);
        self.errors += other.errors;
        self.first_errno = self.first_errno.or(other.first_errno);
        self.iothread_cpu_s += other.iothread_cpu_s;
        self.wall_s = self.wall_s.max(other.wall_s);
        self.counters.merge(&other.counters);
    }
}

/// What the completion callbacks share: the load generator, the file and the write flags.
struct JobState {
    generator: Generator<'static>,
    file: IoFile,
    fua: bool,
}

/// Issues `slot`'s next request (if the generator has one) on `buf` (allocated if the slot has
/// none yet; trims need none), its completion going to [`on_complete`], which issues the one
/// after it. A request the engine refuses counts as failed.
fn issue<L, E>(
    engine: &AttachedEngine<L, E>,
    state: &Rc<RefCell<JobState>>,
    slot: usize,
    buf: Option<AlignedBuf>,
) where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    let request = {
        let mut s = state.borrow_mut();
        let Some(r) = s.generator.issue(slot, Instant::now(), None) else {
            return;
        };
        let (file, token) = (&s.file, slot as u64);
        let buf = || {
            buf.unwrap_or_else(|| {
                let mut b = AlignedBuf::new(r.len);
                b.fill(0x5a);
                b
            })
        };
        match r.direction {
            Direction::Read => Request::read(file, r.offset, buf(), token),
            Direction::Write if s.fua => {
                Request::write(file, r.offset, buf(), token).with_flags(RwFlags::FUA)
            }
            Direction::Write => Request::write(file, r.offset, buf(), token),
            Direction::Trim => Request::discard(file, r.offset, r.len as u64, token),
        }
    };
    let st = state.clone();
    let sent = engine.submit_with(request, move |_, engine, c| {
        on_complete(engine, st, slot, c)
    });
    if let Err(e) = sent {
        let errno = std::io::Error::from(e)
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        state.borrow_mut().generator.refused(slot, errno);
    }
}

/// `slot`'s request finished: counted, and the slot's next request issued on its buffer.
fn on_complete<L, E>(
    engine: &AttachedEngine<L, E>,
    state: Rc<RefCell<JobState>>,
    slot: usize,
    c: Completion,
) where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    let result = transferred(&c.result);
    let now = Instant::now();
    state
        .borrow_mut()
        .generator
        .complete(slot, result, now, None);
    issue(engine, &state, slot, c.buf.into_one());
}

/// Runs `spec` with `engine` on `file` (of `file_size` bytes) in a fresh context over
/// `monitor`. A trim job needs an engine that takes discards (for Linux AIO, one behind
/// [`WithFallback`](aio_core::engine::WithFallback): see [`aio::EngineOptions::with_fallback_pool`]).
pub fn run_job<L, E>(
    monitor: L,
    engine: E,
    file: &IoFile,
    file_size: u64,
    spec: JobSpec,
) -> std::io::Result<JobResult>
where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    run_job_in(monitor, engine, file, 0..file_size, spec)
}

/// As [`run_job`], on the bytes `region` of `file` only: every offset falls in it (one of
/// several iothreads sharing a job, each in its own region: `iothreads=` in job files).
pub fn run_job_in<L, E>(
    monitor: L,
    mut engine: E,
    file: &IoFile,
    region: std::ops::Range<u64>,
    spec: JobSpec,
) -> std::io::Result<JobResult>
where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    let region_size = region.end.saturating_sub(region.start);
    let blocks = region_size / spec.bs as u64;
    if blocks == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the file's region ({region_size} bytes) is smaller than one block ({} bytes)",
                spec.bs
            ),
        ));
    }
    if let Some(n) = spec.max_batch {
        engine.set_max_batch(n);
    }
    let ctx = AioContext::new(monitor)?;
    ctx.set_poll_params(match spec.poll_max_ns {
        PollMaxNs::Auto => PollParams::auto(),
        PollMaxNs::Fixed(ns) => PollParams::iothread()
            .with_max_ns(ns)
            .with_rule(spec.poll_rule),
    });
    // The idle disks: registered, never ready.
    let idle: Vec<Notifier> = (0..spec.idle_fds)
        .map(|_| Notifier::new())
        .collect::<std::io::Result<_>>()?;
    for n in &idle {
        ctx.set_fd_handler(n, FdHandler::new().on_read(|_| {}).on_poll(|| false))
            .map_err(std::io::Error::from)?;
    }
    let start = Instant::now();
    let cpu_start = thread_cpu_seconds();
    let window = Window::new(start, spec.ramp, spec.runtime);
    let generator = Generator::new(&LoadSpec {
        pattern: spec.pattern,
        rwmixread: spec.rwmixread,
        bs: spec.bs,
        blocks,
        layout: Layout::contiguous(region.start),
        slots: spec.iodepth,
        seed: 0x9e37_79b9_7f4a_7c15,
        window,
        io_limit: spec.io_limit,
    });
    let state = Rc::new(RefCell::new(JobState {
        generator,
        file: file.clone(),
        fua: spec.fua,
    }));
    // Every request is submitted with its own completion (`on_complete`).
    let engine = ctx.attach_engine(engine, |_, _| {})?;
    engine.plug();
    for slot in 0..spec.iodepth {
        issue(&engine, &state, slot, None);
    }
    engine.unplug();
    while state.borrow().generator.in_flight() > 0 {
        ctx.poll(true);
    }
    drop(
        engine
            .detach(&ctx)
            .map_err(|(e, _)| std::io::Error::from(e))?,
    );
    for n in &idle {
        let _ = ctx.remove_fd_handler(n);
    }
    let state = Rc::into_inner(state).expect("the callbacks are gone with the engine");
    let figures = state.into_inner().generator.into_figures();
    // The window: from the ramp's end to the deadline, or to the last completion when the
    // job's I/O ran out first.
    let end = match (spec.io_limit, figures.last_measured) {
        (Some(_), Some(last)) => last.min(window.deadline),
        _ => Instant::now().min(window.deadline),
    };
    let errors = figures.total().errors;
    Ok(JobResult {
        read: figures.read,
        write: figures.write,
        trim: figures.trim,
        elapsed: end
            .saturating_duration_since(window.measure_from)
            .max(Duration::from_millis(1)),
        counters: ctx.counters(),
        errors,
        first_errno: figures.first_failure.map(|f| f.errno()),
        iothread_cpu_s: thread_cpu_seconds() - cpu_start,
        wall_s: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)]
    use super::*;
    #[allow(unused_imports)]
    use std::io::Write;
    #[allow(unused_imports)]
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    #[cfg(all(feature = "pool", feature = "poll"))]
    fn a_short_job_moves_data_and_measures_it() {
        let path = std::env::temp_dir().join(format!("aio-bench-job-{}", std::process::id()));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&vec![7u8; 1 << 20]))
            .unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .map(IoFile::from)
            .unwrap();
        let run = |spec: JobSpec| {
            let engine = aio_pool::ThreadPool::new(aio_pool::PoolConfig::default()).unwrap();
            run_job(
                aio_backend_poll::PollLoop::new(),
                engine,
                &file,
                1 << 20,
                spec,
            )
            .unwrap()
        };
        let patterns = [
            Pattern::RandRead,
            Pattern::Write,
            Pattern::RandReadWrite,
            Pattern::RandTrim,
        ];
        for pattern in patterns {
            let spec = JobSpec {
                ramp: Duration::from_millis(20),
                idle_fds: 8,
                rwmixread: 70,
                // FUA writes where the job writes.
                fua: pattern == Pattern::Write,
                ..JobSpec::new(pattern, 4096, 4, Duration::from_millis(150))
            };
            let r = run(spec);
            let t = r.total();
            assert!(t.ios > 0 && r.errors == 0, "{pattern}: {r:?}");
            assert_eq!(t.bytes, t.ios * 4096);
            assert!(r.iops() > 0.0 && r.mean_lat_us() > 0.0);
            match pattern {
                Pattern::RandRead => assert_eq!(r.write.ios + r.trim.ios, 0),
                Pattern::Write => assert_eq!(r.read.ios + r.trim.ios, 0),
                Pattern::RandTrim => assert_eq!((r.read.ios, r.write.ios), (0, 0)),
                _ => assert!(
                    r.read.ios > r.write.ios && r.write.ios > 0,
                    "70% reads: {} reads, {} writes",
                    r.read.ios,
                    r.write.ios
                ),
            }
        }
        // Without time_based: the job stops after io_limit bytes, long before its runtime.
        let spec = JobSpec {
            io_limit: Some(64 * 4096),
            ..JobSpec::new(Pattern::Read, 4096, 4, Duration::from_secs(30))
        };
        let r = run(spec);
        assert_eq!(r.read.ios, 64, "exactly io_limit / bs requests");
        // Stopped by the limit (the count above), before the 30 s runtime could end it.
        assert!(r.wall_s < 30.0, "{} s: the runtime ended the job", r.wall_s);
        let _ = std::fs::remove_file(&path);
    }
}
