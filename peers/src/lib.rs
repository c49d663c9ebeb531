//! # aio-peers
//!
//! The same job through aio-rs and through its Rust peers, side by side (the `aio-peers`
//! binary runs it; this library is its pieces, for a comparison of your own).
//!
//! The job: 4 KiB (`bs`) O_DIRECT random reads of one file or device, `qd` workers each keeping
//! one read in flight (a task or future per worker that loops: read, record, read again), for a
//! warm-up and then a measured window. Every variant opens the target itself, in its own way,
//! and uses its own runtime on the calling thread, its own file type and its own buffers:
//!
//! * [`rivals`]: tokio-uring, monoio (io_uring driver), glommio, and tokio's `spawn_blocking`
//!   with `pread`;
//! * [`ours`]: aio-rs engine futures on io_uring, Linux AIO and the thread pool, per-request
//!   callbacks that resubmit (`submit_with`) on io_uring and Linux AIO, and the pool's
//!   `run_async` with `pread` (aio-rs's `spawn_blocking`).
//!
//! This module owns the job ([`Job`]), the per-worker bookkeeping every variant shares
//! ([`Worker`]: offsets, latency histogram, counts) and one run of one variant ([`run`]: CPU
//! time from `getrusage(RUSAGE_SELF)` around it, so worker threads count). The rounds, the
//! table and the ratios are [`report`]'s.

pub mod ours;
pub mod report;
pub mod rivals;

use std::fmt;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aio::Pairing;
use aio_bench::cpus::process_cpu_seconds;
use aio_bench::load::generator::transferred;
use aio_bench::load::{
    latency_histogram, Generator, Layout, LoadFigures, LoadSpec, Pattern, Window,
};
use hdrhistogram::Histogram;

/// One way of running the job (tables list them in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// tokio-uring: its runtime, `tokio_uring::fs::File::read_at` into a `Vec<u8>` slice.
    TokioUring,
    /// monoio with its io_uring driver: `monoio::fs::File::read_at` into a `Vec<u8>` slice.
    Monoio,
    /// glommio: `DmaFile::read_at_aligned`, buffers from glommio's own allocator.
    Glommio,
    /// aio-rs engine futures (`AttachedEngine::read`) on io_uring.
    AioUringAsync,
    /// aio-rs per-request callbacks on io_uring, each completion submitting the next read.
    AioUringCallback,
    /// aio-rs engine futures on Linux AIO.
    AioLinuxAioAsync,
    /// aio-rs per-request callbacks on Linux AIO.
    AioLinuxAioCallback,
    /// tokio's current-thread runtime, `spawn_blocking` + `pread` per read.
    TokioSpawnBlocking,
    /// aio-rs engine futures on its thread pool (QEMU's `aio=threads`).
    AioPoolAsync,
    /// aio-rs's `PoolContext::run_async` + `pread` per read (`spawn_blocking` on the loop).
    AioPoolRunAsync,
}

impl Variant {
    /// Every variant, in the order a round runs them (odd rounds run it backwards).
    pub const ALL: [Variant; 10] = [
        Variant::TokioUring,
        Variant::AioUringAsync,
        Variant::Monoio,
        Variant::AioUringCallback,
        Variant::Glommio,
        Variant::AioLinuxAioAsync,
        Variant::AioLinuxAioCallback,
        Variant::TokioSpawnBlocking,
        Variant::AioPoolAsync,
        Variant::AioPoolRunAsync,
    ];

    /// The name in tables, JSON and `--variants`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::TokioUring => "tokio-uring",
            Variant::Monoio => "monoio",
            Variant::Glommio => "glommio",
            Variant::AioUringAsync => "aio-uring-async",
            Variant::AioUringCallback => "aio-uring-callback",
            Variant::AioLinuxAioAsync => "aio-linux-aio-async",
            Variant::AioLinuxAioCallback => "aio-linux-aio-callback",
            Variant::TokioSpawnBlocking => "tokio-spawn-blocking",
            Variant::AioPoolAsync => "aio-pool-async",
            Variant::AioPoolRunAsync => "aio-pool-run-async",
        }
    }

    /// An io_uring runtime of another project (the peers the async targets compare with).
    pub fn is_uring_peer(self) -> bool {
        matches!(
            self,
            Variant::TokioUring | Variant::Monoio | Variant::Glommio
        )
    }

    /// The variant called `name`, if any.
    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What every variant runs.
#[derive(Debug, Clone)]
pub struct Job {
    /// The file or block device, opened by each variant with O_DIRECT.
    pub path: PathBuf,
    /// Blocks of `bs` bytes the reads pick from.
    pub blocks: u64,
    /// Bytes per read.
    pub bs: usize,
    /// Workers, each with one read in flight.
    pub qd: usize,
    /// Warm-up before the measured window.
    pub ramp: Duration,
    /// The measured window.
    pub secs: Duration,
    /// aio-rs's adaptive polling limit (`PollParams::with_max_ns`); the peers have no such knob.
    pub poll_max_ns: aio_loop::PollMaxNs,
    /// aio-rs's fd monitor, or the io_uring engine's ring shared with it.
    pub fdmon: Pairing,
    /// aio-rs's io_uring engine registers the file and each worker's buffer with its ring.
    pub uring_registered: bool,
}

impl Job {
    /// The `qd` workers of one run, whose clocks start now.
    pub fn workers(&self) -> Vec<Worker> {
        let start = Instant::now();
        (0..self.qd)
            .map(|i| Worker::new(self, i as u64, start))
            .collect()
    }
}

/// One worker's state: where it reads next, and what it measured: a load generator of one
/// slot (`aio_bench::load::generator`, the same every other path of the bench uses). Every variant
/// that runs a task per worker drives it with [`Worker::read_until_done`], giving only how its
/// runtime reads; the callback variant calls [`Worker::start`] and [`Worker::finish`] itself.
#[derive(Debug)]
pub struct Worker {
    load: Generator<'static>,
}

impl Worker {
    fn new(job: &Job, index: u64, start: Instant) -> Worker {
        // A different seed per worker; the same for every variant.
        let seed = 0x9e37_79b9_7f4a_7c15 ^ (index + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        Worker {
            load: Generator::new(&LoadSpec {
                pattern: Pattern::RandRead,
                rwmixread: 100,
                bs: job.bs,
                blocks: job.blocks,
                layout: Layout::contiguous(0),
                slots: 1,
                seed,
                window: Window::new(start, job.ramp, job.secs),
                io_limit: None,
            }),
        }
    }

    /// The byte offset of the next read, issued at `now` (a uniformly random block); `None`
    /// from the run's deadline on.
    pub fn start(&mut self, now: Instant) -> Option<u64> {
        self.load.issue(0, now, None).map(|r| r.offset)
    }

    /// Records the read [`start`](Self::start) issued, which returned `result` (bytes read; a
    /// short read is a failure), and returns the time now (the next read's start).
    pub fn finish(&mut self, result: &io::Result<usize>) -> Instant {
        let now = Instant::now();
        self.load.complete(0, transferred(result), now, None);
        now
    }

    /// The read [`start`](Self::start) issued was refused by the runtime: it counts as failed.
    pub fn refused(&mut self, errno: i32) {
        self.load.refused(0, errno);
    }

    /// The reads completed in the measured window and their latency; the reads that failed or
    /// came back short, whenever; every read completed, warm-up included (CPU per request
    /// divides by that).
    pub fn figures(&self) -> &LoadFigures {
        self.load.figures()
    }

    /// The loop of every worker task: reads one at a time until the run's deadline, each
    /// `read(buf, offset)` (this runtime's read, handing the buffer back with the result), and
    /// records each. An `Err` from `read` itself (the runtime failed, not the read) ends it.
    pub async fn read_until_done<B, F, Fut>(mut self, mut buf: B, mut read: F) -> io::Result<Worker>
    where
        F: FnMut(B, u64) -> Fut,
        Fut: Future<Output = io::Result<(io::Result<usize>, B)>>,
    {
        let mut t = Instant::now();
        while let Some(offset) = self.start(t) {
            let (result, back) = read(buf, offset).await?;
            buf = back;
            t = self.finish(&result);
        }
        Ok(self)
    }
}

/// What one run of one variant measured.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Latency of the reads completed in the measured window, in ns.
    pub latency_ns: Histogram<u64>,
    /// Reads completed in the measured window.
    pub measured: u64,
    /// Every read completed, warm-up included.
    pub completed: u64,
    /// Reads that failed or came back short.
    pub errors: u64,
    /// The measured window, in seconds.
    pub window_s: f64,
    /// User + system CPU time of the whole process over the run (its worker threads, the
    /// kernel's work on its behalf in syscalls), in seconds.
    pub cpu_s: f64,
    /// aio-rs's loop counters, for the aio-rs variants (name, value).
    pub counters: Vec<(&'static str, u64)>,
}

impl Sample {
    /// Reads per second in the measured window.
    pub fn iops(&self) -> f64 {
        self.measured as f64 / self.window_s
    }

    /// Mean latency in µs.
    pub fn mean_lat_us(&self) -> f64 {
        self.latency_ns.mean() / 1000.0
    }

    /// 99th percentile latency in µs.
    pub fn p99_us(&self) -> f64 {
        self.latency_ns.value_at_quantile(0.99) as f64 / 1000.0
    }

    /// CPU time per completed read, in µs.
    pub fn cpu_us_per_req(&self) -> f64 {
        1e6 * self.cpu_s / self.completed.max(1) as f64
    }
}

/// What a variant's run hands back: its workers, and the loop's counters for aio-rs.
pub type Outcome = (Vec<Worker>, Vec<(&'static str, u64)>);

/// Runs `variant` once on `job`.
pub fn run(variant: Variant, job: &Job) -> io::Result<Sample> {
    let device_before = device_reads(&job.path);
    let cpu_start = process_cpu_seconds();
    let (workers, counters) = match variant {
        Variant::TokioUring => (rivals::tokio_uring(job)?, Vec::new()),
        Variant::Monoio => (rivals::monoio(job)?, Vec::new()),
        Variant::Glommio => (rivals::glommio(job)?, Vec::new()),
        Variant::TokioSpawnBlocking => (rivals::tokio_spawn_blocking(job)?, Vec::new()),
        ours => ours::run(ours, job)?,
    };
    let cpu_s = process_cpu_seconds() - cpu_start;
    let mut sample = Sample {
        latency_ns: latency_histogram(),
        measured: 0,
        completed: 0,
        errors: 0,
        window_s: job.secs.as_secs_f64(),
        cpu_s,
        counters,
    };
    for w in &workers {
        let f = w.figures();
        let _ = sample.latency_ns.add(&f.read.latency_ns);
        sample.measured += f.read.ios;
        sample.completed += f.completed;
        sample.errors += f.read.errors;
    }
    // On a block device every read must reach it: a runtime that quietly reads through the
    // page cache (glommio drops O_DIRECT for a node on devtmpfs, which it takes for tmpfs) is
    // not doing the job, and its figure is left out.
    if let (Some(before), Some(after)) = (device_before, device_reads(&job.path)) {
        let reached = after.saturating_sub(before);
        if reached * 10 < sample.completed * 9 {
            return Err(io::Error::other(format!(
                "{} of {} reads reached the device: the rest came from the page cache, \
                 not O_DIRECT",
                reached, sample.completed
            )));
        }
    }
    Ok(sample)
}

/// Reads completed by the block device at `path` (`/sys/dev/block/MAJ:MIN/stat`, first
/// field), or `None` when `path` is not a block device.
fn device_reads(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// Opens `path` for reading with O_DIRECT, as std's `File` (aio-rs and the `pread` variants).
pub fn open_direct(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio::{Choice, MonitorKind};

    fn job(qd: usize) -> Job {
        Job {
            path: PathBuf::from("/nonexistent"),
            blocks: 100,
            bs: 4096,
            qd,
            ramp: Duration::ZERO,
            secs: Duration::from_secs(60),
            poll_max_ns: aio_loop::PollMaxNs::Fixed(0),
            fdmon: Pairing::Apart(Choice::Named(MonitorKind::Epoll)),
            uring_registered: false,
        }
    }

    #[test]
    fn offsets_are_whole_blocks_inside_the_target_and_differ_per_worker() {
        let offsets = |w: &mut Worker| -> Vec<u64> {
            (0..1000)
                .map(|_| {
                    let o = w.start(Instant::now()).expect("before the deadline");
                    w.finish(&Ok(4096));
                    o
                })
                .collect()
        };
        let mut workers = job(2).workers();
        let a = offsets(&mut workers[0]);
        let b = offsets(&mut workers[1]);
        assert!(a.iter().all(|o| o % 4096 == 0 && *o < 100 * 4096));
        assert_ne!(a, b);
        // Every variant gets the same sequence for the same worker.
        assert_eq!(a, offsets(&mut job(2).workers().remove(0)));
    }

    #[test]
    fn short_and_failed_reads_are_errors_not_measurements() {
        let mut w = job(1).workers().remove(0);
        for result in [
            Ok(4096),
            Ok(512),
            Err(io::Error::from_raw_os_error(libc::EIO)),
        ] {
            w.start(Instant::now()).expect("before the deadline");
            w.finish(&result);
        }
        let f = w.figures();
        assert_eq!((f.completed, f.read.ios, f.read.errors), (3, 1, 2));
        assert_eq!(f.read.latency_ns.len(), 1);
    }

    #[test]
    fn no_read_is_issued_from_the_deadline_on() {
        let mut j = job(1);
        j.secs = Duration::ZERO;
        assert_eq!(j.workers()[0].start(Instant::now()), None);
    }

    #[test]
    fn variant_names_round_trip() {
        for v in Variant::ALL {
            assert_eq!(Variant::from_name(v.name()), Some(v));
        }
        assert_eq!(Variant::from_name("io_uring"), None);
    }
}
