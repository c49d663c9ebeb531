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
//! This module owns one queue's target for the bench's load generator
//! ([`crate::load::generator`]) and what the queue counted; [`super::client`] sets the device
//! up, starts the threads and merges what they counted.

use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aio_vhost_user_blk::testing::blkio::{Blkioq, Completion, ReqFlags};
use aio_vhost_user_blk::testing::ClientError;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::load::verify::Ledger;
use crate::load::DriveError;
use crate::load::{
    drive, Direction, Generator, Issued, Layout, LoadFigures, LoadSpec, Target, Window,
};

use super::error::VhostError;
use super::spec::ClientSpec;

/// How long a queue may go without a completion while requests are in flight before the run
/// fails (the daemon stopped answering).
pub const STALL: Duration = Duration::from_secs(10);

/// What one queue's thread counted (or, for the thread that measures the daemon, its CPU
/// time).
#[derive(Debug, Default)]
pub(super) struct QueueStats {
    /// The queue's requests, their failures and their checks.
    pub(super) figures: LoadFigures,
    /// The daemon's CPU time in the window.
    pub(super) daemon_cpu: Option<Duration>,
}

impl QueueStats {
    /// The measurer's part: the daemon's CPU time.
    pub(super) fn cpu(cpu: Duration) -> QueueStats {
        QueueStats {
            daemon_cpu: Some(cpu),
            ..QueueStats::default()
        }
    }

    /// Adds another thread's counts.
    pub(super) fn merge(&mut self, o: QueueStats) {
        self.figures.merge(&o.figures);
        self.daemon_cpu = self.daemon_cpu.or(o.daemon_cpu);
    }
}

/// One queue's target: its libblkio queue, its slots' buffers in the mapped region, its
/// completion fd, and whether another queue of the run failed.
struct QueueTarget<'a> {
    queue: Blkioq,
    fd: RawFd,
    q: usize,
    bs: usize,
    /// The first slot's buffer in the mapped region.
    base: usize,
    completions: Vec<MaybeUninit<Completion>>,
    failed: &'a AtomicBool,
}

impl QueueTarget<'_> {
    /// Slot `i`'s buffer.
    fn buf(&self, i: usize) -> *mut u8 {
        (self.base + i * self.bs) as *mut u8
    }
}

impl Target for QueueTarget<'_> {
    type Error = VhostError;

    /// Queued; the next `do_io` (in `reap`) kicks the device.
    fn submit(&mut self, request: Issued) -> Result<(), i32> {
        let (buf, len) = (self.buf(request.slot), request.len);
        match request.direction {
            Direction::Read => {
                self.queue
                    .read(request.offset, buf, len, request.slot, ReqFlags::empty())
            }
            Direction::Write => {
                self.queue
                    .write(request.offset, buf, len, request.slot, ReqFlags::empty())
            }
            Direction::Trim => {
                self.queue
                    .discard(request.offset, len as u64, request.slot, ReqFlags::empty())
            }
        }
        Ok(())
    }

    /// Kicks the device for what was queued and takes what completed, never waiting.
    fn reap(&mut self, done: &mut Vec<(usize, Result<u64, i32>)>) -> Result<(), VhostError> {
        let n = self
            .queue
            .do_io(&mut self.completions, 0, None, None)
            .map_err(|source| ClientError::Blkio {
                what: "libblkio: do_io".into(),
                source,
            })?;
        for c in &self.completions[..n] {
            // SAFETY: do_io initialised the first `n` entries; `Completion` is plain data
            // (its error message pointer is only read by Display, never here).
            let c = unsafe { c.assume_init_read() };
            let result = if c.ret == 0 {
                Ok(self.bs as u64)
            } else {
                Err(-c.ret)
            };
            done.push((c.user_data, result));
        }
        Ok(())
    }

    /// Sleeps in poll(2) on the completion fd (at most `limit`, and at most a second, so a
    /// stalled daemon and the window's end are noticed), then clears the eventfd.
    fn wait(&mut self, limit: Duration) -> Result<(), VhostError> {
        // SAFETY: the completion fd belongs to the queue, which outlives this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let ms = limit.min(Duration::from_secs(1)).as_millis().max(1) as u16;
        let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut pfd, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(VhostError::failed(format!(
                    "queue {}: poll on the completion fd: {}",
                    self.q,
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

    fn stopped(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    unsafe fn slot_memory(&mut self, slot: usize) -> Option<&mut [u8]> {
        // SAFETY: slot `slot`'s buffer is `bs` bytes of the mapped region, apart from every
        // other slot's, and no request uses it now (the caller's promise): nothing else reads
        // or writes it while the slice lives.
        Some(unsafe { std::slice::from_raw_parts_mut(self.buf(slot), self.bs) })
    }
}

/// Runs queue `q`'s part of `spec` in `window`: `blocks` blocks (`q, q + Q, ...`), its buffers
/// from `base`; stops issuing early when another queue failed (`failed`).
pub(super) fn run_queue(
    mut queue: Blkioq,
    q: usize,
    spec: &ClientSpec,
    blocks: u64,
    base: usize,
    window: Window,
    failed: &AtomicBool,
) -> Result<QueueStats, VhostError> {
    if let Some(cpu) = spec.cpu {
        crate::cpus::pin_to(&[cpu]).map_err(VhostError::failed)?;
    }
    let fd = queue
        .get_completion_fd()
        .ok_or_else(|| VhostError::failed(format!("libblkio: queue {q} has no completion fd")))?;
    queue.set_completion_fd_enabled(true);
    let load = LoadSpec {
        pattern: spec.rw,
        rwmixread: spec.rwmixread,
        bs: spec.bs,
        blocks,
        layout: Layout::interleaved(q as u64, spec.queues as u64),
        slots: spec.iodepth,
        seed: 0x9e37_79b9_7f4a_7c15 ^ (q as u64 + 1) ^ std::process::id() as u64,
        window,
        io_limit: None,
    };
    // The disk's contents are not this run's: a block not written yet may hold anything.
    let mut ledger = spec.verify.then(|| Ledger::unknown(blocks, spec.bs));
    let mut generator = match ledger.as_mut() {
        Some(l) => Generator::verifying(&load, l).map_err(VhostError::bad_input)?,
        None => Generator::new(&load),
    };
    let mut target = QueueTarget {
        queue,
        fd,
        q,
        bs: spec.bs,
        base,
        completions: (0..spec.iodepth).map(|_| MaybeUninit::uninit()).collect(),
        failed,
    };
    drive(&mut generator, &mut target, STALL).map_err(|e| match e {
        DriveError::Stalled { .. } => {
            VhostError::failed(format!("queue {q}: {e} (the daemon stopped answering)"))
        }
        DriveError::Target(e) => e,
    })?;
    Ok(QueueStats {
        figures: generator.into_figures(),
        daemon_cpu: None,
    })
}
