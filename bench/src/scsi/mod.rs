//! The scsi-disk scaling test from the QEMU epoll discussion (1..256 disks on one IOThread),
//! in process, on the real device: `aio-virtio-blk`'s queues served on iothreads, guests
//! driving them through split rings in guest memory.
//!
//! This module owns one cell's run:
//!
//! * a **disk** is a backing image (an O_DIRECT file, or a region of a block device, served
//!   as a window of it: [`BlockDevice::window`](aio_virtio_blk::device::BlockDevice::window))
//!   and `queues` virtqueues, each an `aio-virtio-blk` [`VirtioBlkQueue`] with its kick
//!   eventfd registered in one iothread's context (idle disks' too: that is what the QEMU
//!   test measures), its requests straight into guest memory, one interrupt per batch of
//!   completions, and notifications off while the iothread polls;
//! * the **guest** is one load-generator thread per active disk, keeping `iodepth` requests in
//!   flight, as fio does in the guest, through the disk's
//!   [`SplitRingDriver`](aio_virtio_blk::driver::SplitRingDriver)s: descriptors and the avail
//!   ring written in guest memory, kicks, interrupts, the used ring (`scsi/guest.rs`);
//! * an **iothread** is one [`AioContext`](aio_loop::AioContext) over the chosen monitor with
//!   the chosen engine attached through a [`DataPlane`](aio_virtio_blk::dataplane::DataPlane),
//!   as the daemon runs one. With `iothreads` K, queue `q` of disk `d` is served by iothread
//!   `(d * queues + q) % K` ([`iothread_of`], the daemon's rule), each iothread an
//!   [`aio_loop::IoThread`] that builds its monitor and engine on itself.
//!
//! A cell is three steps (`scsi/run.rs`): set up (the devices and both sides of every queue,
//! the iothreads with their engines attached and their queues started, then the guests),
//! drive (until every guest is done) and collect (the guests' figures, and each iothread's
//! counters, interrupts and CPU time). It never touches a backend's internals: only the
//! `EventLoop` and `IoEngine` traits.
//!
//! [`VirtioBlkQueue`]: aio_virtio_blk::queue::VirtioBlkQueue

mod guest;
mod run;

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::PoisonError;
use std::time::Duration;

use aio_loop::LoopCounters;
use hdrhistogram::Histogram;

use self::guest::GuestStats;
pub use self::run::{run_cell, run_cell_on_iothreads};
use crate::load::{latency_histogram, Pattern};
use crate::targets::image::DiskImage;

/// How a request's data travels between guest memory and the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryPath {
    /// The guest's buffers are aligned for `O_DIRECT`: the device has the engine read into
    /// and write from guest memory itself, no copy, as QEMU does for aligned guest buffers.
    #[default]
    Guest,
    /// The guest's buffers are not aligned for `O_DIRECT`: the device copies them through an
    /// aligned bounce buffer before a write and back after a read, as QEMU does (`--bounce`).
    Bounce,
}

impl MemoryPath {
    /// Both paths, guest first.
    pub const ALL: [MemoryPath; 2] = [MemoryPath::Guest, MemoryPath::Bounce];

    /// The name used in reports (`memory` in the JSON and CSV): `guest` or `bounce`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryPath::Guest => "guest",
            MemoryPath::Bounce => "bounce",
        }
    }
}

impl fmt::Display for MemoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MemoryPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        MemoryPath::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown memory path '{s}' (expected guest or bounce)"))
    }
}

/// The iothread (of `iothreads`) that serves queue `queue` of disk `disk` when every disk has
/// `queues` queues: the daemon's rule ([`aio_virtio_blk::dataplane::iothread_of`]),
/// `(disk * queues + queue) % iothreads` (with one queue per disk, disk `d` is on iothread
/// `d % iothreads`).
pub fn iothread_of(disk: usize, queue: usize, queues: usize, iothreads: usize) -> usize {
    aio_virtio_blk::dataplane::iothread_of(disk * queues, queue, iothreads)
}

/// What one cell runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellSpec {
    /// Disks attached to the iothreads.
    pub disks: usize,
    /// Disks the guest drives (the first `active` ones).
    pub active: usize,
    /// The I/O pattern (mixed patterns are 50/50 reads and writes).
    pub pattern: Pattern,
    /// Block size.
    pub bs: usize,
    /// Requests in flight per active disk.
    pub iodepth: usize,
    /// Measured time.
    pub runtime: Duration,
    /// Warm-up.
    pub ramp: Duration,
    /// Each iothread's adaptive polling limit.
    pub poll_max_ns: aio_loop::PollMaxNs,
    /// How long a disk may stay idle before its doorbell leaves the poll set (QEMU: 7 s).
    pub poll_idle: Duration,
    /// Stamp every block written and check every block read ([`crate::load::verify`]); the images
    /// must have been created with [`DiskImage::create_stamped`]. One request per block at a
    /// time, so that each read has exactly one right answer. The guests stamp and check
    /// their data in guest RAM, on either memory path.
    pub verify: bool,
    /// How the data travels between guest memory and the engine: straight (aligned guest
    /// buffers) or through the device's bounce buffers (misaligned ones, `--bounce`).
    pub memory: MemoryPath,
    /// Iothreads (at least 1), each with its own context, monitor and engine; the queues are
    /// spread over them by [`iothread_of`].
    pub iothreads: usize,
    /// Virtqueues per disk (at least 1), each with its own kick and interrupt; a disk's
    /// guest puts slot `s` on queue `s % queues`.
    pub queues: usize,
    /// How the guest threads are scheduled next to the iothreads.
    pub guest_sched: GuestSched,
}

impl CellSpec {
    /// The quick matrix's cell (`aio-bench matrix`'s defaults; the matrix sets disks, active,
    /// pattern and iothreads per cell): one disk driven with sequential reads of 4 KiB blocks
    /// at iodepth 8, 200 ms ramp and 1 s measured, QEMU's IOThread polling limit (32768 ns),
    /// idle disks out of the poll set after 100 ms, no verify, requests straight into guest
    /// memory, one iothread, one queue per disk.
    pub const fn quick() -> CellSpec {
        CellSpec {
            disks: 1,
            active: 1,
            pattern: Pattern::Read,
            bs: 4096,
            iodepth: 8,
            runtime: Duration::from_secs(1),
            ramp: Duration::from_millis(200),
            poll_max_ns: aio_loop::PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
            poll_idle: Duration::from_millis(100),
            verify: false,
            memory: MemoryPath::Guest,
            iothreads: 1,
            queues: 1,
            guest_sched: GuestSched::Normal,
        }
    }
}

/// How a cell's guest threads are scheduled. On a host with CPUs of their own for the guests
/// (a VMM's vCPUs apart from its iothreads) the choice does not matter; where guests and
/// iothreads share CPUs (`--cpus 0,1` with two iothreads) it decides whether a guest woken by
/// its interrupt preempts the iothread running there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GuestSched {
    /// `SCHED_OTHER`, as QEMU's vCPU threads and iothreads both run: a woken guest may preempt
    /// the iothread on its CPU.
    #[default]
    Normal,
    /// `SCHED_BATCH`: the kernel does not preempt a running thread for a woken guest; the guest
    /// runs when its CPU's iothread sleeps or its time slice ends.
    Batch,
}

impl GuestSched {
    /// The name in flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            GuestSched::Normal => "normal",
            GuestSched::Batch => "batch",
        }
    }

    /// Puts the calling thread under this policy (`Normal` leaves it as it is).
    pub fn apply_to_this_thread(self) -> io::Result<()> {
        if self == GuestSched::Normal {
            return Ok(());
        }
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid `sched_param` that outlives the call, and pid 0 names the
        // calling thread; the call reads nothing else.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl std::str::FromStr for GuestSched {
    type Err = String;

    fn from_str(s: &str) -> Result<GuestSched, String> {
        match s {
            "normal" => Ok(GuestSched::Normal),
            "batch" => Ok(GuestSched::Batch),
            other => Err(format!(
                "unknown guest scheduling '{other}' (expected normal or batch)"
            )),
        }
    }
}

/// What one iothread of a cell did.
#[derive(Debug, Clone)]
pub struct IothreadFigures {
    /// Virtqueues it served (idle disks' included).
    pub queues: usize,
    /// Its CPU time (user + system, `getrusage(RUSAGE_THREAD)`) while the guests ran, s.
    pub cpu_s: f64,
    /// Its loop's counters.
    pub counters: LoopCounters,
    /// Interrupts its queues raised (call eventfd writes: one per batch of completions the
    /// driver asked to hear about).
    pub interrupts: u64,
    /// Requests its queues copied through a bounce buffer (the guest's buffers misaligned).
    pub bounced: u64,
}

/// What one cell measured.
#[derive(Debug, Clone)]
pub struct CellResult {
    /// Requests completed in the measured window (all active disks).
    pub ios: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// The measured window.
    pub elapsed: Duration,
    /// Guest-side latency (doorbell to interrupt), ns.
    pub latency_ns: Histogram<u64>,
    /// The iothreads' loop counters, added up ([`LoopCounters::merge`]).
    pub counters: LoopCounters,
    /// The iothreads' CPU time, added up, s.
    pub iothread_cpu_s: f64,
    /// Each iothread's figures, in iothread order.
    pub per_iothread: Vec<IothreadFigures>,
    /// The guest threads' CPU time, added up, s.
    pub guest_cpu_s: f64,
    /// Every thread of the process over the guests' run, s: the iothreads, the guests, and
    /// the threads doing I/O for the engines (the pool's workers, io_uring's kernel workers).
    pub process_cpu_s: f64,
    /// Interrupts the iothreads raised (each a call eventfd write): one per queue and batch of
    /// completions.
    pub interrupts: u64,
    /// Times a guest waited for an interrupt (a `poll(2)` on its queues' interrupts; each
    /// usually a sleep and a wake-up).
    pub guest_waits: u64,
    /// Requests that failed.
    pub errors: u64,
    /// With verify: reads checked.
    pub verified_reads: u64,
    /// With verify: reads that did not hold what was last written there.
    pub verify_errors: u64,
    /// With verify: the first mismatches (up to 10), each naming its disk and offset.
    pub verify_reports: Vec<String>,
}

impl CellResult {
    /// The iothreads' figures, before any guest's are added.
    fn new(elapsed: Duration, per_iothread: Vec<IothreadFigures>) -> CellResult {
        let interrupts = per_iothread.iter().map(|t| t.interrupts).sum();
        let mut counters = LoopCounters::default();
        for t in &per_iothread {
            counters.merge(&t.counters);
        }
        CellResult {
            ios: 0,
            bytes: 0,
            elapsed,
            latency_ns: latency_histogram(),
            counters,
            iothread_cpu_s: per_iothread.iter().map(|t| t.cpu_s).sum(),
            per_iothread,
            guest_cpu_s: 0.0,
            process_cpu_s: 0.0,
            interrupts,
            guest_waits: 0,
            errors: 0,
            verified_reads: 0,
            verify_errors: 0,
            verify_reports: Vec::new(),
        }
    }

    /// Adds one guest's figures.
    fn add(&mut self, s: GuestStats) {
        self.ios += s.tally.ios;
        self.bytes += s.tally.bytes;
        self.errors += s.tally.errors;
        let _ = self.latency_ns.add(&s.tally.latency_ns);
        self.guest_cpu_s += s.cpu_s;
        self.guest_waits += s.waits;
        self.verified_reads += s.verified_reads;
        self.verify_errors += s.verify_errors;
        self.verify_reports.extend(s.verify_reports);
    }
}

/// Refuses a spec that cannot run on `images`: too few images, more active disks than disks,
/// no iothread or queue, or (with verify) a driven disk not stamped with the cell's block size.
fn check(images: &[DiskImage], spec: &CellSpec) -> io::Result<()> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    if images.len() < spec.disks || spec.active > spec.disks {
        return bad(format!(
            "{} images for {} disks, {} of them active",
            images.len(),
            spec.disks,
            spec.active
        ));
    }
    if spec.iothreads == 0 || spec.queues == 0 {
        return bad(format!(
            "{} iothreads and {} queues per disk: each must be at least 1",
            spec.iothreads, spec.queues
        ));
    }
    if !spec.verify {
        return Ok(());
    }
    let unstamped = images[..spec.active].iter().position(|im| {
        im.ledger()
            .is_none_or(|l| l.lock().unwrap_or_else(PoisonError::into_inner).bs != spec.bs)
    });
    match unstamped {
        None => Ok(()),
        Some(i) => bad(format!(
            "verify: disk {i} ({}) was not stamped with bs {} (DiskImage::create_stamped)",
            images[i].path().display(),
            spec.bs
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_spread_round_robin_over_iothreads() {
        // One queue per disk: disk d on iothread d % K.
        let on: Vec<usize> = (0..5).map(|d| iothread_of(d, 0, 1, 2)).collect();
        assert_eq!(on, [0, 1, 0, 1, 0]);
        // Two queues per disk over three iothreads: (d * 2 + q) % 3.
        let on: Vec<(usize, usize)> = (0..3)
            .map(|d| (iothread_of(d, 0, 2, 3), iothread_of(d, 1, 2, 3)))
            .collect();
        assert_eq!(on, [(0, 1), (2, 0), (1, 2)]);
        assert_eq!(iothread_of(7, 0, 1, 1), 0);
    }

    #[test]
    fn batch_scheduling_reaches_the_calling_thread_and_normal_leaves_it() {
        std::thread::spawn(|| {
            let policy = || {
                // SAFETY: sched_getscheduler only reads the calling thread's policy.
                unsafe { libc::sched_getscheduler(0) }
            };
            GuestSched::Normal.apply_to_this_thread().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
            GuestSched::Batch.apply_to_this_thread().unwrap();
            assert_eq!(policy(), libc::SCHED_BATCH);
        })
        .join()
        .unwrap();
        // SAFETY: as above, for this thread: the other thread's policy did not leak here.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
        assert_eq!("batch".parse(), Ok(GuestSched::Batch));
        assert!("fifo"
            .parse::<GuestSched>()
            .unwrap_err()
            .contains("normal or batch"));
    }
}
