//! What one cell of the scsi-disk test runs: the [`CellSpec`] (disks, pattern, depth, window,
//! iothreads, queues), the memory path of its data ([`MemoryPath`]), how its guests are
//! scheduled ([`GuestSched`]), which iothread serves which queue ([`iothread_of`]) and the
//! check of a spec against its images.
//!
//! This module owns the cell's description only; never its run (`run`, `guest`) or what it
//! measured (`result`).

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::PoisonError;
use std::time::Duration;

use crate::load::Pattern;
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

impl FromStr for GuestSched {
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
/// Refuses a spec that cannot run on `images`: too few images, more active disks than disks,
/// no iothread or queue, or (with verify) a driven disk not stamped with the cell's block size.
pub(super) fn check(images: &[DiskImage], spec: &CellSpec) -> io::Result<()> {
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
