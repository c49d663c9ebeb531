//! The generator and `drive` against a disk in memory: slots kept busy, the window, verify's
//! stamps and checks (a faithful disk, one that loses writes, one whose contents are unknown),
//! failures, refusals, a target that stops answering, the I/O limit.

use super::*;
use std::convert::Infallible;
use std::time::Duration;

use crate::load::verify::{self, Ledger};
use crate::load::{drive, DriveError, Target};

const BS: usize = 4096;

/// A disk in memory: requests queued by `submit` reach it at `flush` and complete at the next
/// `reap`, the newest first.
struct MemoryDisk {
    disk: Vec<u8>,
    slots: Vec<Vec<u8>>,
    queued: Vec<Issued>,
    in_device: Vec<Issued>,
    /// Requests seen, in order.
    submitted: u64,
    /// The most requests in the device at once.
    most_in_device: usize,
    /// Acknowledge writes without writing.
    lose_writes: bool,
    /// Request numbers (from 0) that fail with EIO, and that come back short.
    fail: Vec<u64>,
    short: Vec<u64>,
    numbers: Vec<u64>,
    /// Never complete anything.
    deaf: bool,
    /// Fail the test when two requests in flight share a block (verify promises they never do).
    exclusive: bool,
    /// Refuse every request with this errno.
    refuse: Option<i32>,
    /// Calls of `slot_memory`.
    memory_calls: u64,
    /// Each `wait`: when, and the limit it was given.
    waits: Vec<(Instant, Duration)>,
}

impl MemoryDisk {
    fn new(blocks: u64, slots: usize) -> MemoryDisk {
        MemoryDisk {
            disk: vec![0; blocks as usize * BS],
            slots: vec![vec![0; BS]; slots],
            queued: Vec::new(),
            in_device: Vec::new(),
            submitted: 0,
            most_in_device: 0,
            lose_writes: false,
            fail: Vec::new(),
            short: Vec::new(),
            numbers: vec![0; slots],
            deaf: false,
            exclusive: false,
            refuse: None,
            memory_calls: 0,
            waits: Vec::new(),
        }
    }

    /// Every block stamped with generation 0, as the matrix's images are created.
    fn stamped(mut self) -> MemoryDisk {
        for (b, block) in self.disk.chunks_exact_mut(BS).enumerate() {
            verify::stamp(block, (b * BS) as u64, 0);
        }
        self.exclusive = true;
        self
    }
}

impl Target for MemoryDisk {
    type Error = Infallible;

    fn submit(&mut self, request: Issued) -> Result<(), i32> {
        if let Some(errno) = self.refuse {
            return Err(errno);
        }
        if self.exclusive {
            let mut in_flight = self.queued.iter().chain(&self.in_device);
            let overlaps = in_flight.any(|r| r.offset == request.offset);
            assert!(
                !overlaps,
                "two requests in flight on one block: {request:?}"
            );
        }
        self.numbers[request.slot] = self.submitted;
        self.submitted += 1;
        self.queued.push(request);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Infallible> {
        self.in_device.append(&mut self.queued);
        self.most_in_device = self.most_in_device.max(self.in_device.len());
        Ok(())
    }

    fn reap(&mut self, done: &mut Vec<(usize, Result<u64, i32>)>) -> Result<(), Infallible> {
        if self.deaf {
            return Ok(());
        }
        while let Some(r) = self.in_device.pop() {
            let at = r.offset as usize..r.offset as usize + r.len;
            match r.direction {
                Direction::Read => self.slots[r.slot].copy_from_slice(&self.disk[at]),
                Direction::Write if self.lose_writes => {}
                Direction::Write => self.disk[at].copy_from_slice(&self.slots[r.slot]),
                Direction::Trim => self.disk[at].fill(0),
            }
            let n = self.numbers[r.slot];
            let result = if self.fail.contains(&n) {
                Err(libc::EIO)
            } else if self.short.contains(&n) {
                Ok(512)
            } else {
                Ok(r.len as u64)
            };
            done.push((r.slot, result));
        }
        Ok(())
    }

    fn wait(&mut self, limit: Duration) -> Result<(), Infallible> {
        self.waits.push((Instant::now(), limit));
        std::thread::sleep(limit.min(Duration::from_millis(2)));
        Ok(())
    }

    unsafe fn slot_memory(&mut self, slot: usize) -> Option<&mut [u8]> {
        self.memory_calls += 1;
        Some(&mut self.slots[slot])
    }
}

/// Runs a verifying load of `pattern` for `runtime_ms` on `disk` against `ledger` (a block
/// each of the ledger's, a slot each of the disk's).
fn verified_run(
    pattern: Pattern,
    disk: &mut MemoryDisk,
    ledger: &mut Ledger,
    runtime_ms: u64,
) -> LoadFigures {
    let s = spec(
        pattern,
        ledger.acked.len() as u64,
        disk.slots.len(),
        runtime_ms,
    );
    let mut g = Generator::verifying(&s, ledger).unwrap();
    drive(&mut g, disk, Duration::from_secs(5)).unwrap();
    g.into_figures()
}

fn spec(pattern: Pattern, blocks: u64, slots: usize, runtime_ms: u64) -> LoadSpec {
    LoadSpec {
        pattern,
        rwmixread: 50,
        bs: BS,
        blocks,
        layout: Layout::contiguous(0),
        slots,
        seed: 7,
        window: Window::new(
            Instant::now(),
            Duration::ZERO,
            Duration::from_millis(runtime_ms),
        ),
        io_limit: None,
    }
}

#[test]
fn every_slot_stays_busy_until_the_deadline_and_only_the_window_is_measured() {
    let mut s = spec(Pattern::RandReadWrite, 64, 8, 60);
    s.window = Window::new(
        Instant::now(),
        Duration::from_millis(20),
        Duration::from_millis(40),
    );
    let mut disk = MemoryDisk::new(64, 8);
    let mut g = Generator::new(&s);
    drive(&mut g, &mut disk, Duration::from_secs(5)).unwrap();
    assert_eq!(g.in_flight(), 0);
    assert_eq!(disk.most_in_device, 8, "every slot had a request in flight");
    let f = g.figures();
    let t = f.total();
    assert_eq!(f.completed, disk.submitted, "each request completed once");
    assert!(
        t.ios > 0 && t.ios < f.completed,
        "the ramp's requests are not measured: {t:?}"
    );
    assert_eq!(t.latency_ns.len(), t.ios);
    assert_eq!(t.bytes, t.ios * BS as u64);
    assert!(f.read.ios > 0 && f.write.ios > 0, "a 50/50 mix");
    assert_eq!((t.errors, f.first_failure), (0, None));
    assert_eq!(
        disk.memory_calls, 0,
        "a generator that does not verify wants no memory"
    );
    // Nothing is issued from the deadline on.
    let mut g = Generator::new(&s);
    assert_eq!(g.issue(0, s.window.deadline, None), None);
    assert!(g.issue(0, s.window.measure_from, None).is_some());
}

#[test]
fn verify_passes_on_a_faithful_disk_and_names_a_lost_write() {
    let mut ledger = Ledger::new(16, BS);
    let mut disk = MemoryDisk::new(16, 4).stamped();
    let f = verified_run(Pattern::RandReadWrite, &mut disk, &mut ledger, 40);
    let v = f.verify;
    assert!(v.stamped > 0 && v.verified > 0, "{v:?}");
    assert_eq!(v.mismatches, 0, "{:?}", v.reports);
    assert!(ledger.busy.iter().all(|b| !b), "every block free again");
    assert!(ledger.acked.iter().any(|a| a.is_some_and(|g| g > 0)));

    // The same disk, but writes are acknowledged and never land.
    let mut ledger = Ledger::new(16, BS);
    let mut disk = MemoryDisk::new(16, 4).stamped();
    disk.lose_writes = true;
    let v = verified_run(Pattern::RandReadWrite, &mut disk, &mut ledger, 40).verify;
    assert!(v.mismatches > 0, "{v:?}");
    assert!(
        v.reports[0].contains("stale or lost write"),
        "{:?}",
        v.reports
    );
}

#[test]
fn a_disk_of_unknown_contents_may_be_unstamped_but_not_misplaced() {
    let mut ledger = Ledger::unknown(8, BS);
    let mut disk = MemoryDisk::new(8, 2);
    disk.exclusive = true;
    let v = verified_run(Pattern::RandRead, &mut disk, &mut ledger, 20).verify;
    assert!(
        v.unstamped > 0 && v.verified == 0 && v.mismatches == 0,
        "{v:?}"
    );

    // Every block holds block 0's stamp: misplaced everywhere but at 0.
    let mut disk = MemoryDisk::new(8, 2);
    disk.exclusive = true;
    let mut block0 = vec![0; BS];
    verify::stamp(&mut block0, 0, 3);
    for block in disk.disk.chunks_exact_mut(BS) {
        block.copy_from_slice(&block0);
    }
    let mut ledger = Ledger::unknown(8, BS);
    let v = verified_run(Pattern::RandRead, &mut disk, &mut ledger, 20).verify;
    assert!(v.mismatches > 0 && v.unstamped == 0, "{v:?}");
    assert!(v.reports[0].contains("holds the block stamped for offset 0"));
}

#[test]
fn a_ledger_that_does_not_fit_the_load_is_refused() {
    let s = spec(Pattern::RandRead, 8, 2, 20);
    assert!(Generator::verifying(&s, &mut Ledger::new(9, BS)).is_err());
    assert!(Generator::verifying(&s, &mut Ledger::new(8, 512)).is_err());
    let many = spec(Pattern::RandRead, 8, 9, 20);
    let e = Generator::verifying(&many, &mut Ledger::new(8, BS)).unwrap_err();
    assert!(e.contains("a block per request in flight"), "{e}");
    // As many blocks as slots is enough.
    assert!(
        Generator::verifying(&spec(Pattern::RandRead, 8, 8, 20), &mut Ledger::new(8, BS)).is_ok()
    );
    // Blocks must hold a stamp's header and whole 8-byte words.
    let sized = |bs: usize| {
        let s = LoadSpec {
            bs,
            ..spec(Pattern::RandRead, 8, 2, 20)
        };
        Generator::verifying(&s, &mut Ledger::new(8, bs)).is_ok()
    };
    assert!(sized(verify::HEADER) && sized(verify::HEADER + 8));
    assert!(!sized(verify::HEADER - 8) && !sized(verify::HEADER + 4));
}

#[test]
fn a_verifying_generator_counts_only_acknowledged_writes_and_survives_refusals() {
    // Every write fails: none is stamped, and the blocks' contents become unknown.
    let mut ledger = Ledger::new(16, BS);
    let mut disk = MemoryDisk::new(16, 4).stamped();
    disk.fail = (0..100_000).collect();
    let f = verified_run(Pattern::RandWrite, &mut disk, &mut ledger, 20);
    assert!(f.write.errors > 0);
    assert_eq!(f.verify.stamped, 0, "failed writes are not stamped blocks");
    assert!(ledger.acked.iter().any(Option::is_none));
    // Every write lands: each is stamped, and no write counts as a read checked.
    let mut ledger = Ledger::new(16, BS);
    let mut disk = MemoryDisk::new(16, 4).stamped();
    let f = verified_run(Pattern::RandWrite, &mut disk, &mut ledger, 20);
    assert_eq!(f.verify.stamped, f.completed);
    assert_eq!((f.verify.verified, f.verify.unstamped), (0, 0));
    // A target that refuses every request: reads and writes fail, nothing is checked.
    let mut ledger = Ledger::new(16, BS);
    let mut disk = MemoryDisk::new(16, 4).stamped();
    disk.refuse = Some(libc::EAGAIN);
    let f = verified_run(Pattern::RandReadWrite, &mut disk, &mut ledger, 20);
    assert_eq!(f.total().errors, 4);
    assert_eq!((f.verify.verified, f.verify.mismatches), (0, 0));
    assert!(ledger.busy.iter().all(|b| !b));
}

#[test]
fn mismatches_are_all_counted_and_the_first_reported() {
    let mut ledger = Ledger::new(64, BS);
    let mut disk = MemoryDisk::new(64, 8).stamped();
    disk.lose_writes = true;
    let v = verified_run(Pattern::RandReadWrite, &mut disk, &mut ledger, 40).verify;
    assert!(v.mismatches > MAX_REPORTS as u64, "{v:?}");
    assert_eq!(v.reports.len(), MAX_REPORTS);
}

#[test]
fn failures_and_short_transfers_count_whenever_and_the_first_is_named() {
    let s = spec(Pattern::RandRead, 64, 1, 30);
    let mut disk = MemoryDisk::new(64, 1);
    disk.fail = vec![2];
    disk.short = vec![4];
    let mut g = Generator::new(&s);
    drive(&mut g, &mut disk, Duration::from_secs(5)).unwrap();
    let f = g.into_figures();
    assert_eq!(f.read.errors, 2);
    // The last completion may come after the deadline: done, not measured.
    assert!(f.read.ios + 2 <= f.completed && f.read.ios + 3 >= f.completed);
    let first = f.first_failure.unwrap();
    assert_eq!(
        (first.cause, first.errno()),
        (FailureCause::Errno(libc::EIO), libc::EIO)
    );
    assert!(
        first.to_string().starts_with("read of 4096 bytes at "),
        "{first}"
    );
}

#[test]
fn refused_requests_fail_and_free_their_slot() {
    let s = spec(Pattern::RandWrite, 64, 4, 10_000);
    let mut disk = MemoryDisk::new(64, 4);
    disk.refuse = Some(libc::EINVAL);
    let mut g = Generator::new(&s);
    drive(&mut g, &mut disk, Duration::from_secs(5)).unwrap();
    let f = g.into_figures();
    assert_eq!((f.completed, f.write.errors, f.write.ios), (4, 4, 0));
    assert_eq!(f.first_failure.map(|e| e.errno()), Some(libc::EINVAL));
}

#[test]
fn a_target_that_stops_answering_is_given_up() {
    let s = spec(Pattern::RandRead, 64, 3, 10);
    let mut disk = MemoryDisk::new(64, 3);
    disk.deaf = true;
    let mut g = Generator::new(&s);
    let stall = Duration::from_millis(40);
    let e = drive(&mut g, &mut disk, stall).unwrap_err();
    assert!(matches!(e, DriveError::Stalled { in_flight: 3, .. }), "{e}");
    assert_eq!((g.in_flight(), g.figures().read.errors), (0, 3));
    // Each wait ends by the deadline while the run lasts, and by the stall after it.
    let deadline = s.window.deadline;
    let (before, after): (Vec<_>, Vec<_>) = disk.waits.iter().partition(|(at, _)| *at < deadline);
    assert!(!before.is_empty() && !after.is_empty());
    // Before the deadline a wait is bounded by the time left of the 10 ms run, never by the
    // 40 ms stall (when the wait began is not compared with the deadline: a thread preempted
    // between the two readings of the clock would be late by the machine's load alone).
    let runtime = deadline - s.window.measure_from;
    assert!(before.iter().all(|(_, limit)| *limit <= runtime));
    assert!(after.iter().all(|(_, limit)| *limit <= stall));
    assert!(after
        .iter()
        .any(|(_, limit)| *limit > deadline - s.window.measure_from));
}

#[test]
fn the_io_limit_ends_the_load_before_its_runtime() {
    let mut s = spec(Pattern::Read, 64, 4, 30_000);
    s.io_limit = Some(10 * BS as u64);
    let mut disk = MemoryDisk::new(64, 4);
    let mut g = Generator::new(&s);
    drive(&mut g, &mut disk, Duration::from_secs(5)).unwrap();
    let f = g.into_figures();
    assert_eq!((f.read.ios, disk.submitted), (10, 10));
    // Sequential: blocks 0..10 in order.
    assert!(f.last_measured.unwrap() < s.window.deadline);
}

#[test]
fn interleaved_streams_share_a_disk_without_sharing_a_block() {
    let l = Layout::interleaved(1, 3);
    assert_eq!(l.offset(0, 512), 512);
    assert_eq!(l.offset(2, 512), 7 * 512);
    assert_eq!(Layout::contiguous(4096).offset(1, 512), 4608);
    let blocks = |i| (0..100).map(move |b| Layout::interleaved(i, 3).offset(b, 1));
    let mut all: Vec<u64> = (0..3).flat_map(blocks).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 300);
}

#[test]
fn figures_of_two_loads_add_up_and_keep_the_first_failure() {
    let run = |fail: Vec<u64>| {
        let mut disk = MemoryDisk::new(64, 2);
        disk.fail = fail;
        let mut g = Generator::new(&spec(Pattern::RandWrite, 64, 2, 10));
        drive(&mut g, &mut disk, Duration::from_secs(5)).unwrap();
        g.into_figures()
    };
    let (a, b) = (run(vec![]), run(vec![0, 1]));
    let mut sum = a.clone();
    sum.merge(&b);
    assert_eq!(sum.completed, a.completed + b.completed);
    assert_eq!(sum.write.ios, a.write.ios + b.write.ios);
    assert_eq!(sum.total().errors, 2);
    assert_eq!(sum.first_failure, b.first_failure);
    assert_eq!(sum.last_measured, a.last_measured.max(b.last_measured));

    // Verify's counts add up; the reports are kept once each, at most MAX_REPORTS.
    let verified = |lose_writes: bool| {
        let mut ledger = Ledger::new(16, BS);
        let mut disk = MemoryDisk::new(16, 4).stamped();
        disk.lose_writes = lose_writes;
        verified_run(Pattern::RandReadWrite, &mut disk, &mut ledger, 20)
    };
    let (good, bad) = (verified(false), verified(true));
    let mut sum = good.clone();
    sum.merge(&bad);
    let (v, g, b) = (&sum.verify, &good.verify, &bad.verify);
    assert!(g.stamped > 0 && b.mismatches > 0, "{g:?} {b:?}");
    assert_eq!(v.stamped, g.stamped + b.stamped);
    assert_eq!(v.verified, g.verified + b.verified);
    assert_eq!(v.unstamped, g.unstamped + b.unstamped);
    assert_eq!(v.mismatches, g.mismatches + b.mismatches);
    assert_eq!(v.reports, b.reports);
    let mut twice = bad.clone();
    twice.merge(&bad);
    assert_eq!(twice.verify.reports, bad.verify.reports, "each report once");
    let mut many = LoadFigures::default();
    for i in 0..2 * MAX_REPORTS {
        let mut one = LoadFigures::default();
        one.verify.reports.push(format!("report {i}"));
        one.verify.unstamped = 1;
        many.merge(&one);
    }
    assert_eq!(many.verify.reports.len(), MAX_REPORTS);
    assert_eq!(many.verify.unstamped, 2 * MAX_REPORTS as u64);
    assert_eq!(many.verify.reports[0], "report 0");
}
