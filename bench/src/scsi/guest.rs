//! The guest of a matrix cell: one thread per active disk, keeping `iodepth` requests in flight
//! on the disk's virtqueues as fio does in the guest.
//!
//! This module owns the guest's side of the virtqueues: the target the bench's load generator
//! drives ([`crate::load::generator`]: each request put on the disk's next queue in turn, the
//! doorbells of the queues a batch filled rung once, the interrupts waited for, the used rings
//! reaped; with verify, the slots of guest RAM where the generator stamps and checks) and the
//! guest's figures ([`GuestStats`]). It never touches the iothread's context or the engine.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags};

use super::memory::GuestRam;
use super::{CellSpec, GuestRequest, Virtqueue};
use crate::cpus::thread_cpu_seconds;
use crate::error::BenchError;
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
    wake_iothread: Option<aio_core::NotifyHandle>,
}

impl GuestDone {
    /// Counts into `finished`, wakes through `wake_iothread`.
    pub(super) fn new(
        finished: Arc<AtomicUsize>,
        wake_iothread: Option<aio_core::NotifyHandle>,
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

/// Starts the guest of disk `disk` (`blocks` blocks of `spec.bs`) on the disk's virtqueues
/// `vqs` with its slots in `ram`, checking reads against `ledger` with verify; it runs on
/// `place.cpus`, and `place.done` counts it finished.
pub(super) fn spawn(
    vqs: Vec<Arc<Virtqueue>>,
    ram: Arc<GuestRam>,
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
            let mut target = VirtqueueTarget {
                vqs: &vqs,
                next_queue: 0,
                pending: vec![Vec::new(); vqs.len()],
                ram: &ram,
                disk,
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

/// The guest's target: the disk's virtqueues, each request put on the next queue in turn, the
/// doorbells of the queues that got one rung once per batch, the interrupts waited for.
struct VirtqueueTarget<'a> {
    /// The disk's virtqueues.
    vqs: &'a [Arc<Virtqueue>],
    /// The queue the next request goes on.
    next_queue: usize,
    /// Per queue, the requests of the batch not made available yet.
    pending: Vec<Vec<GuestRequest>>,
    /// The guest RAM; this guest's slots are those of disk `disk`.
    ram: &'a GuestRam,
    disk: usize,
    /// Waits for an interrupt.
    waits: u64,
}

impl Target for VirtqueueTarget<'_> {
    fn submit(&mut self, request: Issued) -> Result<(), i32> {
        self.pending[self.next_queue].push(GuestRequest {
            slot: request.slot as u32,
            offset: request.offset,
            write: request.direction != Direction::Read,
        });
        self.next_queue = (self.next_queue + 1) % self.vqs.len();
        Ok(())
    }

    /// Makes the batch available and kicks the ioeventfd of every queue that got a request.
    fn flush(&mut self) -> Result<(), BenchError> {
        for (vq, pending) in self.vqs.iter().zip(&mut self.pending) {
            if pending.is_empty() {
                continue;
            }
            let mut avail = vq.avail.lock().unwrap_or_else(PoisonError::into_inner);
            avail.extend(pending.drain(..));
            vq.avail_len.store(avail.len(), Ordering::Release);
            drop(avail);
            // The iothread is polling this queue: it sees the request without a kick (the
            // fence pairs with the one after the iothread clears `no_notify`).
            std::sync::atomic::fence(Ordering::SeqCst);
            if !vq.no_notify.load(Ordering::Relaxed) {
                let _ = vq.doorbell.notify();
            }
        }
        Ok(())
    }

    fn reap(&mut self, done: &mut Vec<(usize, Result<u64, i32>)>) -> Result<(), BenchError> {
        for vq in self.vqs {
            done.extend(vq.take_used().into_iter().map(|e| {
                let result = if e.result < 0 {
                    Err(-e.result as i32)
                } else {
                    Ok(e.result as u64)
                };
                (e.slot as usize, result)
            }));
        }
        Ok(())
    }

    /// Waits for an interrupt of any of the disk's queues (at most 100 ms, so a lost one
    /// costs no more).
    fn wait(&mut self, limit: Duration) -> Result<(), BenchError> {
        self.waits += 1;
        let ms = limit.as_millis().clamp(1, 100) as u16;
        if let [vq] = self.vqs {
            let mut pfd = [PollFd::new(vq.interrupt.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut pfd, ms);
            vq.interrupt.test_and_clear();
            return Ok(());
        }
        let mut pfds: Vec<PollFd<'_>> = self
            .vqs
            .iter()
            .map(|vq| PollFd::new(vq.interrupt.as_fd(), PollFlags::POLLIN))
            .collect();
        let _ = poll(&mut pfds, ms);
        for (vq, pfd) in self.vqs.iter().zip(&pfds) {
            if pfd.any().unwrap_or(true) {
                vq.interrupt.test_and_clear();
            }
        }
        Ok(())
    }

    unsafe fn slot_memory(&mut self, slot: usize) -> Option<&mut [u8]> {
        // SAFETY: no request is in flight on the slot (the caller's promise), so this guest
        // thread is its only user.
        Some(unsafe { self.ram.slot_mut(self.disk, slot as u32) })
    }
}
