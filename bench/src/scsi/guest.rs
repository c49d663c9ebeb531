//! The guest of a matrix cell: one thread per active disk, keeping `iodepth` requests in flight
//! on the disk's virtqueues as fio does in the guest.
//!
//! This module owns the guest's side of the virtqueues and its figures: set up (the offsets,
//! the slots, the measured window), drive (put each request on the disk's next queue in turn
//! and ring the doorbells of the queues it filled, wait for an interrupt, reap the used rings;
//! with verify, one request per block, each write's stamp
//! prepared in its slot of guest RAM and every read's stamp checked there, judged against the
//! disk's ledger) and collect ([`GuestStats`]). It never touches the iothread's context or the
//! engine.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags};

use super::memory::GuestRam;
use super::{CellSpec, GuestRequest, UsedEntry, Virtqueue};
use crate::fio::job::thread_cpu_seconds;
use crate::load::verify::{self, Ledger};
use crate::load::{OffsetStream, Tally, Window};

/// How long after its deadline a guest waits for requests still in flight before it counts
/// them as failed (an iothread that stopped answering must not hang the bench).
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// With verify: how many blocks a guest tries before it waits for one to be free.
const BUSY_TRIES: usize = 64;

/// With verify: how many mismatches a guest reports in full.
const MAX_REPORTS: usize = 10;

/// What one guest measured.
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
            // This guest is the disk's only writer while the cell runs.
            let mut ledger = ledger
                .as_ref()
                .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner));
            let mut guest = Guest::set_up(&vqs, &ram, spec, disk, blocks, ledger.as_deref_mut());
            guest.drive();
            guest.stats.cpu_s = thread_cpu_seconds();
            guest.stats
        })
}

/// Where each slot's request went, for the guest's bookkeeping.
#[derive(Debug, Clone, Copy)]
struct SlotInfo {
    issued_at: Instant,
    block: u64,
    write: bool,
    generation: u64,
}

/// One guest while it runs.
struct Guest<'a> {
    /// The disk's virtqueues.
    vqs: &'a [Arc<Virtqueue>],
    /// The queue the next request goes on.
    next_queue: usize,
    /// Per queue, the requests of the current `issue` (kept to reuse their memory).
    pending: Vec<Vec<GuestRequest>>,
    /// The guest RAM; this guest's slots are those of disk `disk`.
    ram: &'a GuestRam,
    disk: usize,
    offsets: OffsetStream,
    /// With verify: the disk's ledger, held for the whole run.
    ledger: Option<&'a mut Ledger>,
    slots: Vec<SlotInfo>,
    /// Slots with no request in flight.
    free: Vec<u32>,
    outstanding: usize,
    window: Window,
    stats: GuestStats,
}

impl<'a> Guest<'a> {
    /// Every slot free, the window starting after the ramp.
    fn set_up(
        vqs: &'a [Arc<Virtqueue>],
        ram: &'a GuestRam,
        spec: CellSpec,
        disk: usize,
        blocks: u64,
        ledger: Option<&'a mut Ledger>,
    ) -> Self {
        let offsets = OffsetStream::new(
            spec.pattern,
            50,
            blocks,
            spec.bs as u64,
            0x9e37 + disk as u64,
        );
        let start = Instant::now();
        let window = Window::new(start, spec.ramp, spec.runtime);
        let idle = SlotInfo {
            issued_at: start,
            block: 0,
            write: false,
            generation: 0,
        };
        Guest {
            vqs,
            next_queue: 0,
            pending: vec![Vec::new(); vqs.len()],
            ram,
            disk,
            offsets,
            ledger,
            slots: vec![idle; spec.iodepth],
            free: (0..spec.iodepth as u32).collect(),
            outstanding: 0,
            window,
            stats: GuestStats {
                tally: Tally::default(),
                verified_reads: 0,
                verify_errors: 0,
                verify_reports: Vec::new(),
                cpu_s: 0.0,
                waits: 0,
            },
        }
    }

    /// Keeps the slots busy until the deadline, then reaps what is still in flight.
    fn drive(&mut self) {
        loop {
            let now = Instant::now();
            if self.window.running(now) && !self.free.is_empty() {
                self.issue(now);
            }
            if self.outstanding == 0 {
                break;
            }
            self.wait_for_interrupt();
            self.stats.waits += 1;
            let now = Instant::now();
            for q in 0..self.vqs.len() {
                for entry in self.vqs[q].take_used() {
                    self.complete(entry, now);
                }
            }
            if now >= self.window.deadline + GIVE_UP_AFTER {
                self.abandon();
                break;
            }
        }
    }

    /// Fills the free slots with requests issued at `now`, each on the next queue in turn,
    /// and kicks the ioeventfd of every queue that got one.
    fn issue(&mut self, now: Instant) {
        while let Some(&slot) = self.free.last() {
            let Some(block) = self.pick_block() else {
                break;
            };
            self.free.pop();
            let request = self.start(slot, block, now);
            self.pending[self.next_queue].push(request);
            self.next_queue = (self.next_queue + 1) % self.vqs.len();
            self.outstanding += 1;
        }
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
    }

    /// The next block to request. With verify, one with no request in flight: `None` when the
    /// blocks tried are all busy (try again after the next completions).
    fn pick_block(&mut self) -> Option<u64> {
        let mut block = self.offsets.next_block();
        if let Some(l) = &self.ledger {
            let mut tries = 0;
            while l.busy[block as usize] && tries < BUSY_TRIES {
                block = self.offsets.next_block();
                tries += 1;
            }
            if l.busy[block as usize] {
                return None;
            }
        }
        Some(block)
    }

    /// The request for `slot` on `block`: read or write as the pattern says; with verify, the
    /// block marked busy and a write given the next generation, its stamp written into the
    /// slot's guest RAM.
    fn start(&mut self, slot: u32, block: u64, now: Instant) -> GuestRequest {
        let write = self.offsets.next_is_write();
        let mut generation = 0;
        if let Some(l) = &mut self.ledger {
            l.busy[block as usize] = true;
            if write {
                generation = l.next_generation;
                l.next_generation += 1;
                // SAFETY: the slot is free (no request in flight on it): this guest's alone.
                let mem = unsafe { self.ram.slot_mut(self.disk, slot) };
                verify::stamp(mem, self.offsets.offset(block), generation);
            }
        }
        self.slots[slot as usize] = SlotInfo {
            issued_at: now,
            block,
            write,
            generation,
        };
        GuestRequest {
            slot,
            offset: self.offsets.offset(block),
            write,
        }
    }

    /// Waits for an interrupt of any of the disk's queues (at most 100 ms, so a lost one
    /// costs no more).
    fn wait_for_interrupt(&self) {
        if let [vq] = self.vqs {
            let mut pfd = [PollFd::new(vq.interrupt.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut pfd, 100u16);
            vq.interrupt.test_and_clear();
            return;
        }
        let mut pfds: Vec<PollFd<'_>> = self
            .vqs
            .iter()
            .map(|vq| PollFd::new(vq.interrupt.as_fd(), PollFlags::POLLIN))
            .collect();
        let _ = poll(&mut pfds, 100u16);
        for (vq, pfd) in self.vqs.iter().zip(&pfds) {
            if pfd.any().unwrap_or(true) {
                vq.interrupt.test_and_clear();
            }
        }
    }

    /// A finished request: its slot free again, the ledger settled, counted if it finished
    /// inside the measured window.
    fn complete(&mut self, entry: UsedEntry, now: Instant) {
        self.outstanding -= 1;
        self.free.push(entry.slot);
        let info = self.slots[entry.slot as usize];
        let result = entry.result;
        self.settle(entry.slot, info, result);
        if self.window.measures(now) {
            if result < 0 {
                self.stats.tally.errors += 1;
            } else {
                self.stats.tally.done(result as u64, info.issued_at, now);
            }
        }
    }

    /// With verify: the block free again; a write acknowledged (or its contents unknown if it
    /// failed); a read's stamp checked in the slot's guest RAM and judged against the
    /// generation last acknowledged.
    fn settle(&mut self, slot: u32, info: SlotInfo, result: i64) {
        let Some(l) = &mut self.ledger else {
            return;
        };
        let b = info.block as usize;
        l.busy[b] = false;
        if info.write {
            l.acked[b] = (result >= 0).then_some(info.generation);
        } else if result >= 0 {
            self.stats.verified_reads += 1;
            let offset = self.offsets.offset(info.block);
            // SAFETY: the request is on the used ring: the slot is this guest's again.
            let stamp = verify::check(unsafe { self.ram.slot(self.disk, slot) }, offset);
            if let Err(e) = l.judge(info.block, offset, stamp) {
                self.stats.verify_errors += 1;
                if self.stats.verify_reports.len() < MAX_REPORTS {
                    let disk = self.disk;
                    self.stats.verify_reports.push(format!("disk {disk}: {e}"));
                }
            }
        }
    }

    /// The iothread stopped answering: the requests in flight count as failed. Their blocks
    /// are free again but their contents unknown.
    fn abandon(&mut self) {
        self.stats.tally.errors += self.outstanding as u64;
        if let Some(l) = &mut self.ledger {
            for (slot, info) in self.slots.iter().enumerate() {
                if !self.free.contains(&(slot as u32)) {
                    l.busy[info.block as usize] = false;
                    l.acked[info.block as usize] = None;
                }
            }
        }
    }
}
