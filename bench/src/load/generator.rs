//! The load generator every path of the bench shares: per request slot, the request it sends
//! next and the one in flight; what finished in the measured window; with verify, each write's
//! stamp and each read's check against the disk's [`Ledger`].
//!
//! This module owns the slots, the offsets, the window and the figures ([`Generator`]); the
//! loop that keeps a target busy is [`drive`](super::drive())'s. It never touches a queue, an
//! engine or a socket. The ways requests reach a disk:
//! - a virtqueue of the in-process matrix (the guest in [`crate::scsi`]) and a vhost-user
//!   socket through libblkio (`crate::vhost`) are [`Target`](super::Target)s: queue, kick,
//!   wait, reap, all on the client's thread, so [`drive`](super::drive()) runs them;
//! - an engine attached to an `AioContext` ([`crate::fio::job`]) delivers each completion to
//!   the request's own callback inside the loop's `poll`, and the slot's next request goes out
//!   from there, as an application's would: the job calls [`Generator::complete`] and
//!   [`Generator::issue`] from its callbacks;
//! - the Rust peers (`aio-bench peers`) run a generator of one slot per worker task and call
//!   the same two from the task: a runtime's futures drive those, not a blocking loop.

use std::fmt;
use std::io;
use std::time::Instant;

use super::pattern::{Direction, OffsetStream, Pattern};
use super::tally::{Tally, Window};
use super::verify::{self, Ledger, ReadVerdict};

/// Mismatch reports a generator keeps in full (the count is always exact).
const MAX_REPORTS: usize = 10;

/// Where block `b` of a generator's stream lies on the disk: byte
/// `base + (b * stride + phase) * bs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The first byte of the region.
    pub base: u64,
    /// Disk blocks from one of the stream's blocks to the next.
    pub stride: u64,
    /// The stream's first disk block after `base`.
    pub phase: u64,
}

impl Layout {
    /// Consecutive blocks from byte `base` on.
    pub fn contiguous(base: u64) -> Layout {
        Layout {
            base,
            stride: 1,
            phase: 0,
        }
    }

    /// Every `of`-th block, starting at block `index` (stream `index` of `of` sharing a disk,
    /// so that each block has one writer).
    pub fn interleaved(index: u64, of: u64) -> Layout {
        Layout {
            base: 0,
            stride: of.max(1),
            phase: index,
        }
    }

    /// The byte offset of the stream's block `block` of `bs` bytes.
    pub fn offset(&self, block: u64, bs: u64) -> u64 {
        self.base + (block * self.stride + self.phase) * bs
    }
}

/// What a generator runs.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec {
    /// The pattern.
    pub pattern: Pattern,
    /// The percentage of reads of a mixed pattern (fio's `rwmixread`).
    pub rwmixread: u8,
    /// Bytes per request.
    pub bs: usize,
    /// Blocks of `bs` bytes the stream picks from.
    pub blocks: u64,
    /// Where those blocks lie.
    pub layout: Layout,
    /// Request slots: at most this many requests in flight.
    pub slots: usize,
    /// The offset stream's seed.
    pub seed: u64,
    /// The ramp and the measured window.
    pub window: Window,
    /// No request issued once this many bytes were (fio without `time_based`).
    pub io_limit: Option<u64>,
}

/// A request a generator issued for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    /// The slot (a target's token for it).
    pub slot: usize,
    /// The byte offset on the disk.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
    /// Read, write or trim.
    pub direction: Direction,
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCause {
    /// The target reported this errno (or refused the request with it).
    Errno(i32),
    /// It moved fewer bytes than asked for.
    Short(u64),
}

/// A completion's `io::Result` of bytes moved, as [`Generator::complete`] takes it: the bytes,
/// or the errno (`EIO` for an error that carries none).
pub fn transferred(result: &io::Result<usize>) -> Result<u64, i32> {
    match result {
        Ok(n) => Ok(*n as u64),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// A request that failed: which one, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFailure {
    /// Which way it went.
    pub direction: Direction,
    /// Its offset.
    pub offset: u64,
    /// Its length.
    pub len: usize,
    /// Why.
    pub cause: FailureCause,
}

impl RequestFailure {
    /// The errno to report it with (`EIO` for a short transfer).
    pub fn errno(&self) -> i32 {
        match self.cause {
            FailureCause::Errno(e) => e,
            FailureCause::Short(_) => libc::EIO,
        }
    }
}

impl fmt::Display for RequestFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.direction {
            Direction::Read => "read",
            Direction::Write => "write",
            Direction::Trim => "trim",
        };
        write!(f, "{what} of {} bytes at {}: ", self.len, self.offset)?;
        match self.cause {
            FailureCause::Errno(e) => write!(f, "{}", io::Error::from_raw_os_error(e)),
            FailureCause::Short(n) => write!(f, "short transfer ({n} bytes)"),
        }
    }
}

/// What the checks of a verifying generator found (the ramp's requests included).
#[derive(Debug, Clone, Default)]
pub struct VerifyFigures {
    /// Stamped writes acknowledged.
    pub stamped: u64,
    /// Reads whose stamp matched what the ledger expects.
    pub verified: u64,
    /// Reads of blocks whose contents the ledger does not know that held no stamp (accepted).
    pub unstamped: u64,
    /// Reads that did not hold what the ledger expects.
    pub mismatches: u64,
    /// The first mismatches, in words, each once.
    pub reports: Vec<String>,
}

impl VerifyFigures {
    /// Keeps `report` unless it is kept already or [`MAX_REPORTS`] are.
    fn report(&mut self, report: &str) {
        if self.reports.len() < MAX_REPORTS && !self.reports.iter().any(|r| r == report) {
            self.reports.push(report.to_string());
        }
    }
}

/// What a generator counted.
#[derive(Debug, Clone, Default)]
pub struct LoadFigures {
    /// Reads completed in the measured window; reads that failed, whenever.
    pub read: Tally,
    /// Writes, the same way.
    pub write: Tally,
    /// Trims, the same way.
    pub trim: Tally,
    /// Every request completed, failed or not, the ramp's included.
    pub completed: u64,
    /// The first request that failed.
    pub first_failure: Option<RequestFailure>,
    /// When the last measured request completed.
    pub last_measured: Option<Instant>,
    /// With verify: what the checks found.
    pub verify: VerifyFigures,
}

impl LoadFigures {
    /// Reads, writes and trims together.
    pub fn total(&self) -> Tally {
        let mut t = self.read.clone();
        t.merge(&self.write);
        t.merge(&self.trim);
        t
    }

    /// Adds another generator's counts (the first failure and the first reports kept, the
    /// later completion kept).
    pub fn merge(&mut self, other: &LoadFigures) {
        self.read.merge(&other.read);
        self.write.merge(&other.write);
        self.trim.merge(&other.trim);
        self.completed += other.completed;
        self.first_failure = self.first_failure.or(other.first_failure);
        self.last_measured = self.last_measured.max(other.last_measured);
        let (v, o) = (&mut self.verify, &other.verify);
        v.stamped += o.stamped;
        v.verified += o.verified;
        v.unstamped += o.unstamped;
        v.mismatches += o.mismatches;
        for r in &o.reports {
            v.report(r);
        }
    }

    fn tally(&mut self, direction: Direction) -> &mut Tally {
        match direction {
            Direction::Read => &mut self.read,
            Direction::Write => &mut self.write,
            Direction::Trim => &mut self.trim,
        }
    }
}

/// A slot's request in flight.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// The stream's block (the ledger's index).
    block: u64,
    direction: Direction,
    /// A stamped write's generation.
    generation: u64,
    issued_at: Instant,
}

/// One load generator while it runs: its slots, its offsets, its window and its figures; with
/// verify, the ledger of its blocks, held for the run.
///
/// Contract:
/// - [`issue`](Self::issue) is called for a slot with no request in flight, and gives the
///   slot's next request (`None` from the deadline on, once the I/O limit is reached, or when
///   every block of a verifying generator is busy);
/// - [`complete`](Self::complete) (or [`refused`](Self::refused)) is called once for each
///   request issued; [`abandon`](Self::abandon) gives up every request still in flight;
/// - a verifying generator is given the slot's memory at both: it stamps a write's buffer or
///   clears a read's before the request goes, and checks what a read brought back.
#[derive(Debug)]
pub struct Generator<'l> {
    offsets: OffsetStream,
    layout: Layout,
    bs: usize,
    window: Window,
    io_limit: Option<u64>,
    issued_bytes: u64,
    slots: Vec<Option<InFlight>>,
    in_flight: usize,
    ledger: Option<&'l mut Ledger>,
    figures: LoadFigures,
}

impl Generator<'static> {
    /// A generator for `spec` that does not verify.
    pub fn new(spec: &LoadSpec) -> Generator<'static> {
        Generator {
            offsets: OffsetStream::new(spec.pattern, spec.rwmixread, spec.blocks, spec.seed),
            layout: spec.layout,
            bs: spec.bs,
            window: spec.window,
            io_limit: spec.io_limit,
            issued_bytes: 0,
            slots: vec![None; spec.slots],
            in_flight: 0,
            ledger: None,
            figures: LoadFigures::default(),
        }
    }
}

impl<'l> Generator<'l> {
    /// A generator for `spec` that stamps its writes and checks its reads against `ledger`
    /// (one entry per block of the stream), or an error when the ledger does not fit:
    /// another block size or block count, or fewer blocks than slots (each request needs a
    /// block of its own).
    pub fn verifying(spec: &LoadSpec, ledger: &'l mut Ledger) -> Result<Generator<'l>, String> {
        if ledger.bs != spec.bs || ledger.acked.len() as u64 != spec.blocks {
            return Err(format!(
                "the ledger has {} blocks of {} bytes, the load {} of {}",
                ledger.acked.len(),
                ledger.bs,
                spec.blocks,
                spec.bs
            ));
        }
        if spec.blocks < spec.slots as u64 || spec.bs < verify::HEADER || spec.bs % 8 != 0 {
            return Err(format!(
                "verify needs a block per request in flight and blocks of at least {} bytes: \
                 {} blocks of {} bytes for {} requests",
                verify::HEADER,
                spec.blocks,
                spec.bs,
                spec.slots
            ));
        }
        Ok(Generator {
            ledger: Some(ledger),
            ..Generator::new(spec)
        })
    }

    /// Request slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The ramp and the measured window.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Whether it stamps and checks (and so wants each slot's memory).
    pub fn verifies(&self) -> bool {
        self.ledger.is_some()
    }

    /// What it counted so far.
    pub fn figures(&self) -> &LoadFigures {
        &self.figures
    }

    /// What it counted.
    pub fn into_figures(self) -> LoadFigures {
        self.figures
    }

    /// The next request of free `slot`, issued at `now`; `mem` is the slot's buffer when the
    /// generator verifies (a write's stamp goes there). `None`: nothing to issue (see the
    /// type's contract).
    ///
    /// # Panics
    ///
    /// If `slot` has a request in flight, or a verifying generator is given no memory: both
    /// are bugs of the target.
    pub fn issue(&mut self, slot: usize, now: Instant, mem: Option<&mut [u8]>) -> Option<Issued> {
        assert!(self.slots[slot].is_none(), "slot {slot} is in flight");
        let limited = self.io_limit.is_some_and(|l| self.issued_bytes >= l);
        if limited || !self.window.running(now) {
            return None;
        }
        let mut block = self.offsets.next_block();
        let direction = self.offsets.next_direction();
        if let Some(ledger) = self.ledger.as_deref() {
            block = ledger.free_block_from(block)?;
        }
        let offset = self.layout.offset(block, self.bs as u64);
        let mut generation = 0;
        if let Some(ledger) = self.ledger.as_deref_mut() {
            let mem = mem.expect("a verifying generator is given the slot's memory");
            generation = ledger.begin(block, direction, offset, mem);
        }
        self.issued_bytes += self.bs as u64;
        self.in_flight += 1;
        self.slots[slot] = Some(InFlight {
            block,
            direction,
            generation,
            issued_at: now,
        });
        Some(Issued {
            slot,
            offset,
            len: self.bs,
            direction,
        })
    }

    /// `slot`'s request finished at `now` with `result` (bytes moved, or an errno); `mem` is
    /// the slot's buffer when the generator verifies (a read's stamp is checked there).
    /// Counted when it finished inside the measured window; a failure (an errno, or fewer
    /// bytes than asked) is counted whenever it comes, the ramp included, as fio does.
    ///
    /// # Panics
    ///
    /// If `slot` has no request in flight (a completion delivered twice).
    pub fn complete(
        &mut self,
        slot: usize,
        result: Result<u64, i32>,
        now: Instant,
        mem: Option<&[u8]>,
    ) {
        let r = self.slots[slot]
            .take()
            .expect("a completion for a slot with a request in flight");
        self.in_flight -= 1;
        self.figures.completed += 1;
        let offset = self.layout.offset(r.block, self.bs as u64);
        let cause = match result {
            Ok(n) if n == self.bs as u64 => None,
            Ok(n) => Some(FailureCause::Short(n)),
            Err(e) => Some(FailureCause::Errno(e)),
        };
        if let Some(ledger) = self.ledger.as_deref_mut() {
            let ok = cause.is_none();
            let v = &mut self.figures.verify;
            match ledger.finish(r.block, r.direction, r.generation, ok, offset, mem) {
                Some(ReadVerdict::Verified) => v.verified += 1,
                Some(ReadVerdict::Unstamped) => v.unstamped += 1,
                Some(ReadVerdict::Mismatch(e)) => {
                    v.mismatches += 1;
                    v.report(&e.to_string());
                }
                None => v.stamped += u64::from(ok && r.direction == Direction::Write),
            }
        }
        match cause {
            Some(cause) => {
                self.figures.tally(r.direction).errors += 1;
                self.figures.first_failure.get_or_insert(RequestFailure {
                    direction: r.direction,
                    offset,
                    len: self.bs,
                    cause,
                });
            }
            None if self.window.measures(now) => {
                self.figures.last_measured = Some(now);
                let bs = self.bs as u64;
                self.figures.tally(r.direction).done(bs, r.issued_at, now);
            }
            None => {}
        }
    }

    /// `slot`'s request was refused by the target with `errno`: it counts as failed and the
    /// slot is free again.
    pub fn refused(&mut self, slot: usize, errno: i32) {
        self.complete(slot, Err(errno), Instant::now(), None);
    }

    /// The target stopped answering: every request in flight counts as failed, and the
    /// contents of the blocks they were writing are unknown.
    pub fn abandon(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                self.complete(slot, Err(libc::ETIMEDOUT), Instant::now(), None);
            }
        }
    }
}

#[cfg(test)]
#[path = "generator_tests.rs"]
mod tests;
