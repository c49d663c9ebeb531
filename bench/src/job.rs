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
use aio_core::{AioContext, EventLoop, LoopCounters, PollParams};
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
}

impl Pattern {
    /// fio's name for the pattern.
    pub fn fio_name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
        }
    }

    fn is_write(self) -> bool {
        matches!(self, Pattern::Write | Pattern::RandWrite)
    }

    fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "read" => Ok(Pattern::Read),
            "write" => Ok(Pattern::Write),
            "randread" => Ok(Pattern::RandRead),
            "randwrite" => Ok(Pattern::RandWrite),
            other => Err(format!(
                "unknown pattern '{other}' (expected read, write, randread or randwrite)"
            )),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.fio_name())
    }
}

/// What a job does.
#[derive(Debug, Clone, Copy)]
pub struct JobSpec {
    /// The pattern.
    pub pattern: Pattern,
    /// Block size in bytes (a multiple of 512 for O_DIRECT).
    pub bs: usize,
    /// Requests kept in flight.
    pub iodepth: usize,
    /// Measured time.
    pub runtime: Duration,
    /// Time run before measuring starts.
    pub ramp: Duration,
    /// The loop's adaptive polling limit.
    pub poll_max_ns: u64,
}

/// What a job measured.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Completed requests in the measured window.
    pub ios: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Submit-to-completion latency in ns.
    pub latency_ns: Histogram<u64>,
    /// The loop's counters over the whole job.
    pub counters: LoopCounters,
    /// Errors completions reported.
    pub errors: u64,
    /// CPU time (user + system) of the loop thread over the whole job, in seconds.
    pub iothread_cpu_s: f64,
    /// Wall time of the whole job (ramp included), in seconds.
    pub wall_s: f64,
}

/// CPU time (user + system) the calling thread has used, in seconds.
pub fn thread_cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe_zeroed_rusage();
    // SAFETY: `ru` is a valid rusage to fill; RUSAGE_THREAD is Linux's per-thread usage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn unsafe_zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

impl JobResult {
    /// Completed requests per second.
    pub fn iops(&self) -> f64 {
        self.ios as f64 / self.elapsed.as_secs_f64()
    }

    /// MB/s (10^6 bytes per second, as fio's MB/s).
    pub fn mb_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64()
    }

    /// Mean latency in µs.
    pub fn mean_lat_us(&self) -> f64 {
        self.latency_ns.mean() / 1000.0
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
    blocks: u64,
    rng: Rng,
    next_seq: u64,
    started: Vec<Instant>,
    measuring_since: Option<Instant>,
    deadline: Instant,
    ios: u64,
    bytes: u64,
    errors: u64,
    hist: Histogram<u64>,
    outstanding: usize,
}

impl Generator {
    fn request(&mut self, slot: usize, buf: AlignedBuf) -> Request {
        let block = if self.spec.pattern.is_random() {
            self.rng.next() % self.blocks
        } else {
            let b = self.next_seq % self.blocks;
            self.next_seq += 1;
            b
        };
        let offset = block * self.spec.bs as u64;
        self.started[slot] = Instant::now();
        self.outstanding += 1;
        if self.spec.pattern.is_write() {
            Request::write(&self.file, offset, buf, slot as u64)
        } else {
            Request::read(&self.file, offset, buf, slot as u64)
        }
    }
}

/// Runs `spec` with `engine` on `file` (of `file_size` bytes) in a fresh context over
/// `monitor`.
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
    let ctx = AioContext::new(monitor)?;
    ctx.set_poll_params(PollParams {
        max_ns: spec.poll_max_ns,
        ..PollParams::iothread()
    });
    let start = Instant::now();
    let cpu_start = thread_cpu_seconds();
    let generator = Rc::new(RefCell::new(Generator {
        spec,
        file: file.clone(),
        blocks,
        rng: Rng::new(0x9e37_79b9_7f4a_7c15),
        next_seq: 0,
        started: vec![start; spec.iodepth],
        measuring_since: None,
        deadline: start + spec.ramp + spec.runtime,
        ios: 0,
        bytes: 0,
        errors: 0,
        hist: latency_histogram(),
        outstanding: 0,
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
            if gen.measuring_since.is_none() {
                gen.measuring_since = Some(ramp_end);
            }
            match &c.result {
                Ok(n) => {
                    gen.ios += 1;
                    gen.bytes += *n as u64;
                    let ns = now.duration_since(gen.started[i]).as_nanos() as u64;
                    let _ = gen.hist.record(ns.max(1));
                }
                Err(_) => gen.errors += 1,
            }
        }
        if now >= gen.deadline {
            return;
        }
        let Some(buf) = c.buf.into_one() else { return };
        let req = gen.request(i, buf);
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
            if spec.pattern.is_write() {
                buf.fill(0x5a);
            }
            let req = generator.borrow_mut().request(i, buf);
            engine.submit(req).map_err(std::io::Error::from)?;
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
    let end = Instant::now().min(generator.borrow().deadline);
    let gen = generator.borrow();
    let measured_from = gen.measuring_since.unwrap_or(ramp_end);
    Ok(JobResult {
        ios: gen.ios,
        bytes: gen.bytes,
        elapsed: end
            .saturating_duration_since(measured_from)
            .max(Duration::from_millis(1)),
        latency_ns: gen.hist.clone(),
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
        for pattern in [Pattern::RandRead, Pattern::Write] {
            let spec = JobSpec {
                pattern,
                bs: 4096,
                iodepth: 4,
                runtime: Duration::from_millis(150),
                ramp: Duration::from_millis(20),
                poll_max_ns: 32_768,
            };
            let engine = aio_pool::ThreadPool::new(aio_pool::PoolConfig::default()).unwrap();
            let r = run_job(
                aio_backend_poll::PollLoop::new(),
                engine,
                &file,
                1 << 20,
                spec,
            )
            .unwrap();
            assert!(r.ios > 0 && r.errors == 0, "{pattern}: {r:?}");
            assert_eq!(r.bytes, r.ios * 4096);
            assert!(r.iops() > 0.0 && r.mean_lat_us() > 0.0);
        }
        let _ = std::fs::remove_file(&path);
    }
}
