//! One fio-like job against one engine: keep `iodepth` requests in flight on a file for a
//! while and measure IOPS and latency.
//!
//! This module owns the load generator and its measurements. It drives an engine attached to
//! an [`AioContext`] exactly as an application would (submissions from completion callbacks,
//! the loop blocking in `poll`), and it never reaches into an engine's internals.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;
use std::str::FromStr;
use std::time::{Duration, Instant};

use aio_core::engine::{AlignedBuf, AttachedEngine, IoEngine, IoFile, Request};
use aio_core::{AioContext, EventLoop, FdHandler, LoopCounters, Notifier, PollParams, PollRule};
use hdrhistogram::Histogram;

/// The I/O pattern of a job (fio's `rw=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential reads and writes, mixed by `rwmixread` (fio `rw=rw` or `readwrite`).
    ReadWrite,
    /// Random reads and writes, mixed by `rwmixread` (fio `rw=randrw`).
    RandReadWrite,
}

impl Pattern {
    /// Every pattern, in fio's order.
    pub const ALL: [Pattern; 6] = [
        Pattern::Read,
        Pattern::Write,
        Pattern::RandRead,
        Pattern::RandWrite,
        Pattern::ReadWrite,
        Pattern::RandReadWrite,
    ];

    /// fio's name for the pattern.
    pub fn fio_name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::ReadWrite => "rw",
            Pattern::RandReadWrite => "randrw",
        }
    }

    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Pattern::RandRead | Pattern::RandWrite | Pattern::RandReadWrite
        )
    }

    /// The percentage of requests that read, given a mixed job's `rwmixread`.
    pub fn read_percent(self, rwmixread: u8) -> u8 {
        match self {
            Pattern::Read | Pattern::RandRead => 100,
            Pattern::Write | Pattern::RandWrite => 0,
            Pattern::ReadWrite | Pattern::RandReadWrite => rwmixread.min(100),
        }
    }
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "readwrite" {
            return Ok(Pattern::ReadWrite);
        }
        Pattern::ALL
            .into_iter()
            .find(|p| p.fio_name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown pattern '{s}' (expected read, write, randread, randwrite, rw, readwrite or randrw)"
                )
            })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.fio_name())
    }
}

/// Where the next request goes and which way: the offset stream of a job, shared by the job
/// runner and the matrix's guest.
#[derive(Debug, Clone)]
pub(crate) struct OffsetStream {
    pattern: Pattern,
    read_percent: u8,
    blocks: u64,
    bs: u64,
    next_seq: u64,
    rng: Rng,
}

impl OffsetStream {
    /// A stream over `blocks` blocks of `bs` bytes (at least one block).
    pub(crate) fn new(pattern: Pattern, rwmixread: u8, blocks: u64, bs: u64, seed: u64) -> Self {
        OffsetStream {
            pattern,
            read_percent: pattern.read_percent(rwmixread),
            blocks: blocks.max(1),
            bs,
            next_seq: 0,
            rng: Rng::new(seed),
        }
    }

    /// The next block index.
    pub(crate) fn next_block(&mut self) -> u64 {
        if self.pattern.is_random() {
            self.rng.next() % self.blocks
        } else {
            let b = self.next_seq % self.blocks;
            self.next_seq += 1;
            b
        }
    }

    /// Whether the next request writes.
    pub(crate) fn next_is_write(&mut self) -> bool {
        match self.read_percent {
            100 => false,
            0 => true,
            p => self.rng.next() % 100 >= u64::from(p),
        }
    }

    /// The byte offset of `block`.
    pub(crate) fn offset(&self, block: u64) -> u64 {
        block * self.bs
    }
}

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
    pub poll_max_ns: u64,
    /// How the loop's polling window adapts.
    pub poll_rule: PollRule,
    /// Stop issuing after this many bytes (fio without `time_based`: `size` bytes per job).
    pub io_limit: Option<u64>,
    /// Idle fds registered in the loop next to the job's I/O (the matrix's idle disks: a
    /// doorbell notifier each, with read and poll handlers, that never fires).
    pub idle_fds: usize,
    /// The engine's largest batch per submission (`None`: the engine's default).
    pub max_batch: Option<usize>,
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
            poll_max_ns: 32_768,
            poll_rule: PollRule::default(),
            io_limit: None,
            idle_fds: 0,
            max_batch: None,
        }
    }
}

/// What one direction (reads or writes) of a job measured.
#[derive(Debug, Clone)]
pub struct IoStats {
    /// Completed requests in the measured window.
    pub ios: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// Submit-to-completion latency in ns.
    pub latency_ns: Histogram<u64>,
}

impl IoStats {
    fn new() -> IoStats {
        IoStats {
            ios: 0,
            bytes: 0,
            latency_ns: latency_histogram(),
        }
    }

    /// Adds `other`'s requests to these.
    pub fn merge(&mut self, other: &IoStats) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        let _ = self.latency_ns.add(&other.latency_ns);
    }
}

/// What a job measured.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Reads.
    pub read: IoStats,
    /// Writes.
    pub write: IoStats,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// The loop's counters over the whole job.
    pub counters: LoopCounters,
    /// Errors completions reported (and submissions refused).
    pub errors: u64,
    /// CPU time (user + system) of the loop thread over the whole job, in seconds.
    pub iothread_cpu_s: f64,
    /// Wall time of the whole job (ramp included), in seconds.
    pub wall_s: f64,
}

/// CPU time (user + system) the calling thread has used, in seconds.
pub fn thread_cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    // RUSAGE_THREAD (Linux's per-thread usage) cannot fail for the calling thread.
    let Ok(ru) = getrusage(UsageWho::RUSAGE_THREAD) else {
        return 0.0;
    };
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(ru.user_time()) + tv(ru.system_time())
}

impl JobResult {
    /// Reads and writes together.
    pub fn total(&self) -> IoStats {
        let mut t = self.read.clone();
        t.merge(&self.write);
        t
    }

    /// Completed requests per second, both directions.
    pub fn iops(&self) -> f64 {
        (self.read.ios + self.write.ios) as f64 / self.elapsed.as_secs_f64()
    }

    /// MB/s (10^6 bytes per second, as fio's MB/s), both directions.
    pub fn mb_s(&self) -> f64 {
        (self.read.bytes + self.write.bytes) as f64 / 1e6 / self.elapsed.as_secs_f64()
    }

    /// Mean latency in µs, both directions.
    pub fn mean_lat_us(&self) -> f64 {
        self.total().latency_ns.mean() / 1000.0
    }

    /// Adds a parallel clone's results (fio's `numjobs` with `group_reporting`): requests,
    /// errors and CPU add up, the window is the longer one.
    pub fn merge(&mut self, other: &JobResult) {
        self.read.merge(&other.read);
        self.write.merge(&other.write);
        self.elapsed = self.elapsed.max(other.elapsed);
        self.errors += other.errors;
        self.iothread_cpu_s += other.iothread_cpu_s;
        self.wall_s = self.wall_s.max(other.wall_s);
        self.counters.merge(&other.counters);
    }
}

/// A latency histogram in ns (1 ns to 60 s, 3 significant digits), as every report uses.
pub(crate) fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// A small deterministic PRNG (xorshift64*) for offsets.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (never the all-zero state).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

struct Generator {
    spec: JobSpec,
    file: IoFile,
    offsets: OffsetStream,
    started: Vec<Instant>,
    slot_writes: Vec<bool>,
    deadline: Instant,
    issued_bytes: u64,
    read: IoStats,
    write: IoStats,
    errors: u64,
    outstanding: usize,
    last_completion: Option<Instant>,
}

impl Generator {
    /// The next request for `slot`, or `None` once the job's I/O limit is reached.
    fn request(&mut self, slot: usize, buf: AlignedBuf) -> Option<Request> {
        if self
            .spec
            .io_limit
            .is_some_and(|limit| self.issued_bytes >= limit)
        {
            return None;
        }
        let block = self.offsets.next_block();
        let offset = self.offsets.offset(block);
        self.issued_bytes += self.spec.bs as u64;
        self.started[slot] = Instant::now();
        self.outstanding += 1;
        let write = self.offsets.next_is_write();
        self.slot_writes[slot] = write;
        Some(if write {
            Request::write(&self.file, offset, buf, slot as u64)
        } else {
            Request::read(&self.file, offset, buf, slot as u64)
        })
    }
}

/// Runs `spec` with `engine` on `file` (of `file_size` bytes) in a fresh context over
/// `monitor`.
pub fn run_job<L, E>(
    monitor: L,
    mut engine: E,
    file: &IoFile,
    file_size: u64,
    spec: JobSpec,
) -> std::io::Result<JobResult>
where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    let blocks = file_size / spec.bs as u64;
    if blocks == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the file ({file_size} bytes) is smaller than one block ({} bytes)",
                spec.bs
            ),
        ));
    }
    if let Some(n) = spec.max_batch {
        engine.set_max_batch(n);
    }
    let ctx = AioContext::new(monitor)?;
    ctx.set_poll_params(
        PollParams::iothread()
            .with_max_ns(spec.poll_max_ns)
            .with_rule(spec.poll_rule),
    );
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
    let generator = Rc::new(RefCell::new(Generator {
        spec,
        file: file.clone(),
        offsets: OffsetStream::new(
            spec.pattern,
            spec.rwmixread,
            blocks,
            spec.bs as u64,
            0x9e37_79b9_7f4a_7c15,
        ),
        started: vec![start; spec.iodepth],
        slot_writes: vec![false; spec.iodepth],
        deadline: start + spec.ramp + spec.runtime,
        issued_bytes: 0,
        read: IoStats::new(),
        write: IoStats::new(),
        errors: 0,
        outstanding: 0,
        last_completion: None,
    }));
    let engine_slot: Rc<RefCell<Option<AttachedEngine<L, E>>>> = Rc::default();
    let ramp_end = start + spec.ramp;
    // Weak: the slot holds the engine, whose driver holds this callback.
    let (g, slot) = (generator.clone(), Rc::downgrade(&engine_slot));
    let attached = ctx.attach_engine(engine, move |_ctx, c| {
        let now = Instant::now();
        let mut gen = g.borrow_mut();
        gen.outstanding -= 1;
        let i = c.token as usize;
        if now >= ramp_end && now < gen.deadline {
            gen.last_completion = Some(now);
            let ns = now.duration_since(gen.started[i]).as_nanos() as u64;
            match &c.result {
                Ok(n) => {
                    let stats = if gen.slot_writes[i] {
                        &mut gen.write
                    } else {
                        &mut gen.read
                    };
                    stats.ios += 1;
                    stats.bytes += *n as u64;
                    let _ = stats.latency_ns.record(ns.max(1));
                }
                Err(_) => gen.errors += 1,
            }
        }
        if now >= gen.deadline {
            return;
        }
        let Some(buf) = c.buf.into_one() else { return };
        let Some(req) = gen.request(i, buf) else {
            return;
        };
        drop(gen);
        let slot = slot.upgrade();
        let sent = match slot.as_ref().and_then(|s| s.try_borrow().ok()) {
            Some(engine) => match engine.as_ref() {
                Some(engine) => engine.submit(req).is_ok(),
                None => false,
            },
            None => false,
        };
        if !sent {
            // Refused or no engine: it is not outstanding, or the job would wait for it forever.
            let mut gen = g.borrow_mut();
            gen.outstanding -= 1;
            gen.errors += 1;
        }
    })?;
    *engine_slot.borrow_mut() = Some(attached);
    {
        let slot = engine_slot.borrow();
        let engine = slot.as_ref().expect("just set");
        engine.plug();
        for i in 0..spec.iodepth {
            let mut buf = AlignedBuf::new(spec.bs);
            buf.fill(0x5a);
            let Some(req) = generator.borrow_mut().request(i, buf) else {
                break;
            };
            if let Err(e) = engine.submit(req) {
                engine.unplug();
                return Err(std::io::Error::from(e));
            }
        }
        engine.unplug();
    }
    while generator.borrow().outstanding > 0 {
        ctx.poll(true);
    }
    let attached = engine_slot.borrow_mut().take().expect("engine");
    drop(
        attached
            .detach(&ctx)
            .map_err(|(e, _)| std::io::Error::from(e))?,
    );
    for n in &idle {
        let _ = ctx.remove_fd_handler(n);
    }
    let gen = generator.borrow();
    // The window: from the ramp's end to the deadline, or to the last completion when the
    // job's I/O ran out first.
    let end = match (spec.io_limit, gen.last_completion) {
        (Some(_), Some(last)) => last.min(gen.deadline),
        _ => Instant::now().min(gen.deadline),
    };
    Ok(JobResult {
        read: gen.read.clone(),
        write: gen.write.clone(),
        elapsed: end
            .saturating_duration_since(ramp_end)
            .max(Duration::from_millis(1)),
        counters: ctx.counters(),
        errors: gen.errors,
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
        for pattern in [Pattern::RandRead, Pattern::Write, Pattern::RandReadWrite] {
            let spec = JobSpec {
                ramp: Duration::from_millis(20),
                idle_fds: 8,
                rwmixread: 70,
                ..JobSpec::new(pattern, 4096, 4, Duration::from_millis(150))
            };
            let r = run(spec);
            let t = r.total();
            assert!(t.ios > 0 && r.errors == 0, "{pattern}: {r:?}");
            assert_eq!(t.bytes, t.ios * 4096);
            assert!(r.iops() > 0.0 && r.mean_lat_us() > 0.0);
            match pattern {
                Pattern::RandRead => assert_eq!(r.write.ios, 0),
                Pattern::Write => assert_eq!(r.read.ios, 0),
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
        assert!(r.wall_s < 10.0);
        let _ = std::fs::remove_file(&path);
    }
}
