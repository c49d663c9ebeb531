//! The guest of a matrix cell: one thread per active disk, keeping `iodepth` requests in flight
//! on the disk's virtqueues as fio does in the guest.
//!
//! This module owns the guest's side of the virtqueues: the target the bench's load generator
//! drives ([`crate::load::generator`]) over the disk's [`SplitRingDriver`]s (slot `s` of the
//! guest on queue `s % queues`, the queues a batch filled kicked once each unless the device
//! polls them, the interrupts waited for, the used rings reaped; with verify, the slots'
//! buffers in guest memory where the generator stamps and checks) and the guest's figures
//! ([`GuestStats`]). It never touches the iothread's context or the device.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aio_virtio_blk::driver::{DriverError, DriverRequest, Finished, SplitRingDriver};
use aio_virtio_blk::spec;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::spec::CellSpec;
use crate::cpus::thread_cpu_seconds;
use crate::load::verify::Ledger;
use crate::load::{drive, Direction, Generator, Issued, Layout, LoadSpec, Tally, Target, Window};

/// How long a guest waits without a completion while requests are in flight before it counts
/// them as failed (an iothread that stopped answering must not hang the bench).
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// What one guest measured.
#[derive(Default)]
pub(super) struct GuestStats {
    /// Requests completed, and failed, in the measured window (and those abandoned, as
    /// failed), with their doorbell-to-interrupt latency.
    pub(super) tally: Tally,
    /// With verify: reads checked.
    pub(super) verified_reads: u64,
    /// With verify: reads that did not hold what was last written there.
    pub(super) verify_errors: u64,
    /// With verify: the first mismatches.
    pub(super) verify_reports: Vec<String>,
    /// The guest thread's CPU time, s.
    pub(super) cpu_s: f64,
    /// Waits for an interrupt.
    pub(super) waits: u64,
}

/// Counts a guest as finished and wakes the iothread that waits for it (if any) when dropped:
/// also when the guest panics, so the iothread never waits for a guest that is gone.
pub(super) struct GuestDone {
    finished: Arc<AtomicUsize>,
    wake_iothread: Option<aio_loop::NotifyHandle>,
}

impl GuestDone {
    /// Counts into `finished`, wakes through `wake_iothread`.
    pub(super) fn new(
        finished: Arc<AtomicUsize>,
        wake_iothread: Option<aio_loop::NotifyHandle>,
    ) -> Self {
        GuestDone {
            finished,
            wake_iothread,
        }
    }
}

impl Drop for GuestDone {
    fn drop(&mut self) {
        self.finished.fetch_add(1, Ordering::AcqRel);
        if let Some(w) = &self.wake_iothread {
            w.notify();
        }
    }
}

/// Where a guest runs and what it reports to: the CPUs it is pinned to (empty: where its
/// parent runs) and the count of finished guests.
pub(super) struct GuestPlace {
    /// CPUs to pin the guest thread to (empty: not pinned).
    pub(super) cpus: Vec<usize>,
    /// Counts the guest finished.
    pub(super) done: GuestDone,
}

/// Starts the guest of disk `disk` (`blocks` blocks of `spec.bs`) on the drivers of the
/// disk's queues, checking reads against `ledger` with verify; it runs on `place.cpus`, and
/// `place.done` counts it finished.
pub(super) fn spawn(
    drivers: Vec<SplitRingDriver>,
    spec: CellSpec,
    disk: usize,
    blocks: u64,
    ledger: Option<Arc<Mutex<Ledger>>>,
    place: GuestPlace,
) -> io::Result<JoinHandle<GuestStats>> {
    std::thread::Builder::new()
        .name(format!("guest-{disk}"))
        .spawn(move || {
            // Dropped last: the guest counts as finished once everything else is let go.
            let _done = place.done;
            if !place.cpus.is_empty() {
                // The CPUs were checked when the process was pinned to their list; a refusal
                // leaves the guest where its parent runs.
                let _ = crate::cpus::pin_to(&place.cpus);
            }
            if let Err(e) = spec.guest_sched.apply_to_this_thread() {
                // Not fatal: the guest runs, as SCHED_OTHER, and the run says so.
                eprintln!(
                    "guest-{disk}: SCHED_{} refused ({e}): running as SCHED_OTHER",
                    spec.guest_sched.name().to_uppercase()
                );
            }
            let load = LoadSpec {
                pattern: spec.pattern,
                rwmixread: 50,
                bs: spec.bs,
                blocks,
                layout: Layout::contiguous(0),
                slots: spec.iodepth,
                seed: 0x9e37 + disk as u64,
                window: Window::new(Instant::now(), spec.ramp, spec.runtime),
                io_limit: None,
            };
            // This guest is the disk's only writer while the cell runs.
            let mut ledger = ledger
                .as_ref()
                .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner));
            let queues = drivers.len();
            let mut target = DriverTarget {
                drivers,
                kick: vec![false; queues],
                lens: vec![0; spec.iodepth],
                used: Vec::new(),
                bs: spec.bs,
                waits: 0,
            };
            let mut stats = GuestStats::default();
            let generator = match ledger.as_deref_mut() {
                Some(l) => Generator::verifying(&load, l),
                None => Ok(Generator::new(&load)),
            };
            let mut generator = match generator {
                Ok(g) => g,
                Err(e) => {
                    // The cell's checks keep this from happening; a guest that cannot run
                    // counts one failure and reports why.
                    stats.tally.errors = 1;
                    stats.verify_reports.push(format!("disk {disk}: {e}"));
                    return stats;
                }
            };
            // A stalled iothread's requests count as failed (abandoned): nothing more to do.
            let _ = drive(&mut generator, &mut target, GIVE_UP_AFTER);
            let figures = generator.into_figures();
            stats.tally = figures.total();
            stats.verified_reads = figures.verify.verified;
            stats.verify_errors = figures.verify.mismatches;
            stats.verify_reports = (figures.verify.reports.into_iter())
                .map(|e| format!("disk {disk}: {e}"))
                .collect();
            stats.waits = target.waits;
            stats.cpu_s = thread_cpu_seconds();
            stats
        })
}

/// Why a guest's queues failed: [`drive`] then ends, and the guest counts what it had.
#[derive(Debug, thiserror::Error)]
enum GuestError {
    /// A queue's kick eventfd could not be written.
    #[error("kicking a queue: {0}")]
    Kick(#[source] io::Error),
    /// A queue's used ring held what the driver refuses.
    #[error("the used ring: {0}")]
    UsedRing(#[source] DriverError),
}

/// The guest's target: the disk's queues through their drivers, slot `s` on queue
/// `s % queues` (its slot `s / queues` there).
struct DriverTarget {
    drivers: Vec<SplitRingDriver>,
    /// The queues that got a request since the last flush.
    kick: Vec<bool>,
    /// Each slot's request length, for its completion.
    lens: Vec<usize>,
    /// The used entries of one reap.
    used: Vec<Finished>,
    bs: usize,
    /// Waits for an interrupt.
    waits: u64,
}

impl DriverTarget {
    /// The queue and its slot of the guest's slot `slot`.
    fn place(&self, slot: usize) -> (usize, u16) {
        let q = self.drivers.len();
        (slot % q, (slot / q) as u16)
    }
}

impl Target for DriverTarget {
    type Error = GuestError;

    fn submit(&mut self, request: Issued) -> Result<(), i32> {
        let (q, local) = self.place(request.slot);
        let kind = match request.direction {
            Direction::Read => spec::T_IN,
            Direction::Write => spec::T_OUT,
            Direction::Trim => return Err(libc::EOPNOTSUPP),
        };
        let post = DriverRequest {
            kind,
            sector: request.offset / spec::SECTOR_SIZE,
            len: request.len as u32,
        };
        self.drivers[q]
            .post(local, post)
            .map_err(|_| libc::EINVAL)?;
        self.lens[request.slot] = request.len;
        self.kick[q] = true;
        Ok(())
    }

    /// Kicks every queue that got a request, unless its device is polling it.
    fn flush(&mut self) -> Result<(), GuestError> {
        for (driver, kick) in self.drivers.iter().zip(&mut self.kick) {
            if std::mem::take(kick) {
                driver.notify().map_err(GuestError::Kick)?;
            }
        }
        Ok(())
    }

    fn reap(&mut self, done: &mut Vec<(usize, Result<u64, i32>)>) -> Result<(), GuestError> {
        let queues = self.drivers.len();
        for (q, driver) in self.drivers.iter_mut().enumerate() {
            self.used.clear();
            driver
                .take_used(&mut self.used)
                .map_err(GuestError::UsedRing)?;
            for f in &self.used {
                let slot = usize::from(f.slot) * queues + q;
                let result = match f.status {
                    spec::S_OK => Ok(self.lens[slot] as u64),
                    _ => Err(libc::EIO),
                };
                done.push((slot, result));
            }
        }
        Ok(())
    }

    /// Waits for an interrupt of any of the disk's queues (at most 100 ms, so a lost one
    /// costs no more).
    fn wait(&mut self, limit: Duration) -> Result<(), GuestError> {
        self.waits += 1;
        let ms = limit.as_millis().clamp(1, 100) as u16;
        let mut pfds: Vec<PollFd<'_>> = (self.drivers.iter())
            .map(|d| PollFd::new(d.interrupt_fd(), PollFlags::POLLIN))
            .collect();
        let _ = poll(&mut pfds, PollTimeout::from(ms));
        let raised: Vec<bool> = pfds.iter().map(|p| p.any().unwrap_or(true)).collect();
        for (driver, raised) in self.drivers.iter().zip(raised) {
            if raised {
                let _ = driver.clear_interrupt();
            }
        }
        Ok(())
    }

    unsafe fn slot_memory(&mut self, slot: usize) -> Option<&mut [u8]> {
        let (q, local) = self.place(slot);
        let bs = self.bs;
        // SAFETY: no request is in flight on the slot (the caller's promise), so the device
        // does not touch its buffer, and the slice lives no longer than this borrow.
        let buf = unsafe { self.drivers[q].data_mut(local) }.ok()?;
        buf.get_mut(..bs)
    }
}
