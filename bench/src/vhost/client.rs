//! The vhost-user-blk client: libblkio's `virtio-blk-vhost-user` driver keeping requests in
//! flight on every virtqueue of one socket, measured like fio.
//!
//! Set-up, as libblkio wants it: `Blkio::new("virtio-blk-vhost-user")`, `path`, `connect`,
//! `num-queues`, `start`, then one memory region (`alloc_mem_region`, `map_mem_region`: a memfd
//! the daemon maps) holding `iodepth` buffers of `bs` bytes per queue.
//!
//! Each queue has its own thread (pinned to the client CPU when one is given, [`super::queue`])
//! and its own part of the disk: queue `q` of `Q` uses blocks `q, q + Q, q + 2Q, ...`, so with
//! `--verify` each block has one writer and each read one right answer. The threads wait for
//! completions on their queue's completion fd, never busy polling.
//!
//! With verify, every write carries [`crate::load::verify`]'s stamp (its offset, a generation and a
//! crc32c) and every read is checked: a block written in this run must hold its last
//! acknowledged generation; a block not yet written in this run may be unstamped, or hold any
//! valid stamp for its offset (an earlier run's). The requests, their checks and the counts are
//! the bench's load generator's ([`crate::load::generator`]), driving one target per queue.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aio_vhost_user_blk::testing::{Client, ClientConfig};
use hdrhistogram::Histogram;

use crate::load::Window;

use super::error::VhostError;
use super::queue::{run_queue, QueueStats};
use super::spec::ClientSpec;

/// The figures of one client run, over the measured window.
#[derive(Debug, Clone)]
pub struct ClientResult {
    /// The disk's capacity in bytes, as the device reports it.
    pub capacity: u64,
    /// Requests completed in the window.
    pub requests: u64,
    /// Of which reads.
    pub reads: u64,
    /// Bytes transferred in the window.
    pub bytes: u64,
    /// The window's length.
    pub window: Duration,
    /// Latency of the window's requests, submission to completion seen, nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// The daemon's CPU time in the window (None without a daemon PID).
    pub daemon_cpu: Option<Duration>,
    /// Stamped writes acknowledged (verify; the ramp's included).
    pub stamped_writes: u64,
    /// Reads whose stamp was checked (verify; the ramp's included).
    pub verified_reads: u64,
    /// Reads of blocks not written in this run that held no stamp (verify: accepted, not
    /// counted in `verified_reads`).
    pub unstamped_reads: u64,
}

impl ClientResult {
    /// Requests per second.
    pub fn iops(&self) -> f64 {
        self.requests as f64 / self.window.as_secs_f64()
    }

    /// Megabytes (10^6 bytes) per second.
    pub fn mb_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.window.as_secs_f64()
    }

    /// Mean latency, µs.
    pub fn mean_us(&self) -> f64 {
        self.latency_ns.mean() / 1e3
    }

    /// Latency percentile `q` (0..=100), µs.
    pub fn percentile_us(&self, q: f64) -> f64 {
        self.latency_ns.value_at_quantile(q / 100.0) as f64 / 1e3
    }

    /// The daemon's CPU time per request, µs (None without a daemon PID or requests).
    pub fn cpu_per_request_us(&self) -> Option<f64> {
        let cpu = self.daemon_cpu?;
        (self.requests > 0).then(|| cpu.as_secs_f64() * 1e6 / self.requests as f64)
    }
}

/// Connects to the vhost-user-blk socket at `socket`, runs `spec` on it and returns the
/// figures; the daemon's CPU time is read around the window when its PID `daemon` is given. A
/// request that fails, a verify mismatch, a daemon that stops answering
/// ([`STALL`](super::queue::STALL)) or vanishes fails the run (after the other queues finished
/// theirs).
pub fn run_client(
    socket: &Path,
    spec: &ClientSpec,
    daemon: Option<u32>,
) -> Result<ClientResult, VhostError> {
    let sock = socket.display().to_string();
    let mut client = Client::connect(&ClientConfig {
        queues: spec.queues,
        region_bytes: spec.queues * spec.iodepth * spec.bs,
        ..ClientConfig::new(socket)
    })?;
    let capacity = client.capacity()?;
    let req_align = client.request_alignment()?;
    if spec.bs as u64 % req_align != 0 {
        return Err(VhostError::bad_input(format!(
            "--bs {}: the device at {sock} needs multiples of {req_align}",
            spec.bs
        )));
    }
    let blocks_per_queue = capacity / spec.bs as u64 / spec.queues as u64;
    let least = if spec.verify {
        2 * spec.iodepth as u64
    } else {
        1
    };
    if blocks_per_queue < least {
        return Err(VhostError::bad_input(format!(
            "the device at {sock} has {capacity} bytes: too small for --bs {} x --queues {}{}",
            spec.bs,
            spec.queues,
            if spec.verify {
                format!(" x 2 --iodepth {} (--verify)", spec.iodepth)
            } else {
                String::new()
            }
        )));
    }
    let region_addr = client.region_addr();
    let queues = client.take_queues();

    let start = Instant::now();
    let window = Window::new(start, spec.ramp, spec.runtime);
    let failed = AtomicBool::new(false);
    let results: Vec<Result<QueueStats, VhostError>> = std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(q, queue)| {
                let base = region_addr + q * spec.iodepth * spec.bs;
                let failed = &failed;
                s.spawn(move || {
                    let r = run_queue(queue, q, spec, blocks_per_queue, base, window, failed);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let cpu = daemon.map(|d| measure_cpu(d, window.measure_from, window.deadline, &failed));
        let mut results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("a client thread panicked"))
            .collect();
        match cpu {
            Some(Ok(cpu)) => results.push(Ok(QueueStats::cpu(cpu))),
            Some(Err(e)) => results.push(Err(e)),
            None => {}
        }
        results
    });
    drop(client);

    let mut total = QueueStats::default();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(stats) => total.merge(stats),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if !errors.is_empty() {
        return Err(VhostError::failed(errors.join("; ")));
    }
    let f = total.figures;
    let t = f.total();
    if t.errors > 0 {
        return Err(VhostError::failed(format!(
            "{} request(s) failed on {sock}; first: {}",
            t.errors,
            f.first_failure.map(|e| e.to_string()).unwrap_or_default()
        )));
    }
    if f.verify.mismatches > 0 {
        return Err(VhostError::failed(format!(
            "--verify: {} mismatch(es) on {sock}: {}",
            f.verify.mismatches,
            f.verify.reports.join("; ")
        )));
    }
    Ok(ClientResult {
        capacity,
        requests: t.ios,
        reads: f.read.ios,
        bytes: t.bytes,
        window: spec.runtime,
        latency_ns: t.latency_ns,
        daemon_cpu: total.daemon_cpu,
        stamped_writes: f.verify.stamped,
        verified_reads: f.verify.verified,
        unstamped_reads: f.verify.unstamped,
    })
}

/// Sleeps until the window opens, reads the daemon's CPU time, sleeps until it closes and
/// reads it again (woken early when a queue failed).
fn measure_cpu(
    daemon: u32,
    from: Instant,
    to: Instant,
    failed: &AtomicBool,
) -> Result<Duration, VhostError> {
    let gone = |e: std::io::Error| VhostError::failed(format!("the daemon (PID {daemon}): {e}"));
    let read = || aio::process::cpu_time(daemon).map_err(gone);
    let sleep_until = |t: Instant| {
        while !failed.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= t {
                break;
            }
            std::thread::sleep((t - now).min(Duration::from_millis(50)));
        }
    };
    sleep_until(from);
    let before = read()?;
    sleep_until(to);
    let after = read()?;
    Ok(after.saturating_sub(before))
}
