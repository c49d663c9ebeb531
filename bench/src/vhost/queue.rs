//! One virtqueue's client thread: `iodepth` request slots in the shared memory region, the
//! offsets, the waits on the completion fd and (verify) the ledger of its blocks.
//!
//! A thread waits as QEMU's `block/blkio.c` does with its completion fd handler: the queue's
//! completion fd is enabled once (libblkio then asks the device for used-buffer notifications,
//! its `used_event` moved past each completion taken), the thread sleeps in `poll(2)` on it,
//! reads the eventfd and calls `Blkioq::do_io` with `min_completions = 0`, which kicks the device
//! for the requests queued and returns the completions there are without blocking; each
//! completion's slot is refilled at once. Nothing spins.
//!
//! This module owns one queue's requests and counts only; [`super::client`] sets the device up,
//! starts the threads and merges what they counted.

use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blkio::{Blkioq, Completion, ReqFlags};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::error::BenchError;
use crate::load::verify::{self, Ledger, VerifyError};
use crate::load::{OffsetStream, Tally, Window};

use super::client::{blkio_err, ClientSpec};

/// How long a queue may go without a completion while requests are in flight before the run
/// fails (the daemon stopped answering).
pub const STALL: Duration = Duration::from_secs(10);

/// Mismatch reports kept (the count is always exact).
const MAX_REPORTS: usize = 8;

/// What one queue's thread counted.
#[derive(Debug)]
pub(super) struct QueueStats {
    /// The requests completed in the window (their bytes, their latency), and the failures.
    pub(super) tally: Tally,
    pub(super) reads: u64,
    pub(super) first_error: Option<String>,
    pub(super) stamped: u64,
    pub(super) verified: u64,
    pub(super) unstamped: u64,
    pub(super) mismatches: u64,
    pub(super) reports: Vec<String>,
    pub(super) daemon_cpu: Option<Duration>,
}

impl QueueStats {
    pub(super) fn new() -> QueueStats {
        QueueStats {
            tally: Tally::default(),
            reads: 0,
            first_error: None,
            stamped: 0,
            verified: 0,
            unstamped: 0,
            mismatches: 0,
            reports: Vec::new(),
            daemon_cpu: None,
        }
    }

    /// The measurer's part: the daemon's CPU time.
    pub(super) fn cpu(cpu: Duration) -> QueueStats {
        QueueStats {
            daemon_cpu: Some(cpu),
            ..QueueStats::new()
        }
    }

    pub(super) fn merge(&mut self, o: QueueStats) {
        self.tally.merge(&o.tally);
        self.reads += o.reads;
        self.first_error = self.first_error.take().or(o.first_error);
        self.stamped += o.stamped;
        self.verified += o.verified;
        self.unstamped += o.unstamped;
        self.mismatches += o.mismatches;
        for r in o.reports {
            if self.reports.len() < MAX_REPORTS && !self.reports.contains(&r) {
                self.reports.push(r);
            }
        }
        self.daemon_cpu = self.daemon_cpu.or(o.daemon_cpu);
    }

    fn mismatch(&mut self, e: VerifyError) {
        self.mismatches += 1;
        let e = e.to_string();
        if self.reports.len() < MAX_REPORTS && !self.reports.contains(&e) {
            self.reports.push(e);
        }
    }
}

/// A request slot: one buffer of the region, at most one request in flight.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The block in this queue's part of the disk (its ledger index).
    local: u64,
    write: bool,
    generation: u64,
    started: Instant,
}

/// One queue's thread: its slots, its offsets and (verify) its blocks' ledger.
pub(super) struct QueueDriver<'a> {
    queue: Blkioq,
    fd: RawFd,
    q: u64,
    spec: &'a ClientSpec,
    /// The first slot's buffer in the mapped region.
    base: usize,
    slots: Vec<Option<Slot>>,
    in_flight: usize,
    stream: OffsetStream,
    ledger: Option<Ledger>,
    stats: QueueStats,
}

impl<'a> QueueDriver<'a> {
    /// Queue `q`'s driver over `blocks` blocks (`q, q + Q, ...`), its buffers from `base`.
    pub(super) fn new(
        mut queue: Blkioq,
        q: usize,
        spec: &'a ClientSpec,
        blocks: u64,
        base: usize,
    ) -> Result<Self, BenchError> {
        if let Some(cpu) = spec.cpu {
            crate::cpus::pin_to(&[cpu]).map_err(BenchError::failed)?;
        }
        let fd = queue.get_completion_fd().ok_or_else(|| {
            BenchError::failed(format!("libblkio: queue {q} has no completion fd"))
        })?;
        queue.set_completion_fd_enabled(true);
        let seed = 0x9e37_79b9_7f4a_7c15 ^ (q as u64 + 1) ^ std::process::id() as u64;
        let ledger = spec.verify.then(|| Ledger {
            bs: spec.bs,
            acked: vec![None; blocks as usize],
            busy: vec![false; blocks as usize],
            next_generation: 1,
        });
        Ok(QueueDriver {
            queue,
            fd,
            q: q as u64,
            spec,
            base,
            slots: vec![None; spec.iodepth],
            in_flight: 0,
            stream: OffsetStream::new(spec.rw, spec.rwmixread, blocks, spec.bs as u64, seed),
            ledger,
            stats: QueueStats::new(),
        })
    }

    /// Slot `i`'s buffer.
    fn buf(&self, i: usize) -> *mut u8 {
        (self.base + i * self.spec.bs) as *mut u8
    }

    /// The byte offset on the disk of this queue's block `local`.
    fn offset(&self, local: u64) -> u64 {
        (local * self.spec.queues as u64 + self.q) * self.spec.bs as u64
    }

    /// Keeps the slots full until `to`, then waits for what is in flight; counts what
    /// completes in `from..to`. Returns early when another queue failed.
    pub(super) fn run(
        &mut self,
        window: Window,
        failed: &AtomicBool,
    ) -> Result<QueueStats, BenchError> {
        let mut completions: Vec<MaybeUninit<Completion>> = (0..self.spec.iodepth)
            .map(|_| MaybeUninit::uninit())
            .collect();
        for i in 0..self.spec.iodepth {
            self.submit(i);
        }
        let mut last_progress = Instant::now();
        loop {
            // Kicks the device for what was queued and takes what completed, never waiting.
            let n = self
                .queue
                .do_io(&mut completions, 0, None, None)
                .map_err(blkio_err("libblkio: do_io"))?;
            let now = Instant::now();
            let running = window.running(now) && !failed.load(Ordering::Relaxed);
            for c in &completions[..n] {
                // SAFETY: do_io initialised the first `n` entries; `Completion` is plain data
                // (its error message pointer is only read by Display, never here).
                let c = unsafe { c.assume_init_read() };
                self.complete(&c, now, window);
                if running {
                    self.submit(c.user_data);
                }
            }
            if n > 0 {
                last_progress = now;
                continue;
            }
            if self.in_flight == 0 {
                break;
            }
            if now.duration_since(last_progress) >= STALL {
                return Err(BenchError::failed(format!(
                    "queue {}: no completion for {} s with {} request(s) in flight (the daemon \
                     stopped answering)",
                    self.q,
                    STALL.as_secs(),
                    self.in_flight
                )));
            }
            self.wait(if running {
                window.deadline - now
            } else {
                STALL
            })?;
        }
        Ok(std::mem::replace(&mut self.stats, QueueStats::new()))
    }

    /// Sleeps in poll(2) on the completion fd (at most `limit`, and at most a second, so a
    /// stalled daemon and the window's end are noticed), then clears the eventfd.
    fn wait(&self, limit: Duration) -> Result<(), BenchError> {
        // SAFETY: the completion fd belongs to the queue, which outlives this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let ms = limit.min(Duration::from_secs(1)).as_millis().max(1) as u16;
        let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut pfd, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(BenchError::failed(format!(
                    "poll on the completion fd: {}",
                    std::io::Error::from(e)
                )))
            }
        }
        if pfd[0].any().unwrap_or(false) {
            let mut counter = [0u8; 8];
            // Non-blocking (libblkio made it so); EAGAIN means another read already took it.
            let _ = nix::unistd::read(fd, &mut counter);
        }
        Ok(())
    }

    /// Puts a new request in slot `i` (queued; the next do_io kicks the device).
    fn submit(&mut self, i: usize) {
        let local = self.pick_block();
        let write = self.stream.next_is_write();
        let offset = self.offset(local);
        let buf = self.buf(i);
        let bs = self.spec.bs;
        let mut generation = 0;
        if let Some(l) = &mut self.ledger {
            l.busy[local as usize] = true;
            // SAFETY: slot `i`'s buffer is `bs` bytes of the mapped region, apart from every
            // other slot's, and no request uses it now (the slot is free): nothing else reads
            // or writes it until the request below is queued.
            let block = unsafe { std::slice::from_raw_parts_mut(buf, bs) };
            if write {
                generation = l.next_generation;
                l.next_generation += 1;
                verify::stamp(block, offset, generation);
            } else {
                // A read that transfers nothing must not pass on an earlier request's stamp.
                block[..8].fill(0);
            }
        }
        self.slots[i] = Some(Slot {
            local,
            write,
            generation,
            started: Instant::now(),
        });
        self.in_flight += 1;
        if write {
            self.queue.write(offset, buf, bs, i, ReqFlags::empty());
        } else {
            self.queue.read(offset, buf, bs, i, ReqFlags::empty());
        }
    }

    /// The next block; with verify one no request of this queue is using (the slots are at
    /// most half the blocks, so a free one is found).
    fn pick_block(&mut self) -> u64 {
        let block = self.stream.next_block();
        let Some(l) = &self.ledger else {
            return block;
        };
        let n = l.busy.len() as u64;
        (0..n)
            .map(|k| (block + k) % n)
            .find(|&b| !l.busy[b as usize])
            .expect("fewer slots than blocks")
    }

    /// A finished request: its slot freed, its result settled (and checked, verify), counted
    /// when it finished inside the measured window.
    fn complete(&mut self, c: &Completion, now: Instant, window: Window) {
        let i = c.user_data;
        let slot = self.slots[i].take().expect("a completion for a busy slot");
        self.in_flight -= 1;
        let offset = self.offset(slot.local);
        let buf = self.buf(i);
        let what = if slot.write { "write" } else { "read" };
        if c.ret != 0 {
            self.stats.tally.errors += 1;
            if self.stats.first_error.is_none() {
                self.stats.first_error = Some(format!(
                    "{what} of {} bytes at {offset}: {}",
                    self.spec.bs,
                    std::io::Error::from_raw_os_error(-c.ret)
                ));
            }
        }
        if let Some(l) = &mut self.ledger {
            let b = slot.local as usize;
            l.busy[b] = false;
            if slot.write {
                // A failed write leaves the block unknown: any valid stamp will do.
                l.acked[b] = (c.ret == 0).then_some(slot.generation);
                self.stats.stamped += u64::from(c.ret == 0);
            } else if c.ret == 0 {
                // SAFETY: the read has completed, so the device no longer writes slot `i`'s
                // buffer (`bs` bytes of the mapped region, apart from the other slots'), and
                // the slot is not reused before this check ends.
                let block = unsafe { std::slice::from_raw_parts(buf, self.spec.bs) };
                let stamp = verify::check(block, offset);
                match (l.acked[b], stamp) {
                    (None, Err(VerifyError::NotStamped { .. })) => self.stats.unstamped += 1,
                    (None, Ok(_)) => self.stats.verified += 1,
                    (None, Err(e)) => self.stats.mismatch(e),
                    (Some(_), stamp) => match l.judge(slot.local, offset, stamp) {
                        Ok(()) => self.stats.verified += 1,
                        Err(e) => self.stats.mismatch(e),
                    },
                }
            }
        }
        if window.measures(now) {
            if !slot.write {
                self.stats.reads += 1;
            }
            self.stats
                .tally
                .done(self.spec.bs as u64, slot.started, now);
        }
    }
}
