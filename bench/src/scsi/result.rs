//! What one cell of the scsi-disk test measured: each iothread's figures
//! ([`IothreadFigures`]) and the cell's ([`CellResult`]), the guests' added up.
//!
//! This module owns the figures and how a guest's are added; never the run that produces
//! them (`run`, `guest`).

use std::time::Duration;

use aio_loop::LoopCounters;
use hdrhistogram::Histogram;

use super::guest::GuestStats;
use crate::load::latency_histogram;

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
    pub(super) fn new(elapsed: Duration, per_iothread: Vec<IothreadFigures>) -> CellResult {
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
    pub(super) fn add(&mut self, s: GuestStats) {
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
