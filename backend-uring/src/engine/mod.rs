//! The io_uring block I/O engine.
//!
//! This module owns one ring used for block I/O: building submission entries from the shared
//! [`InFlightTable`](aio_core::kit::InFlightTable), submitting in batches, reaping the
//! completion queue (in user space; the `io_poll` check is a CQ peek), flushing overflowed
//! completions, and the optional registered file table. Request bookkeeping (remainders, `-EAGAIN`, completions) is aio-core's.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use aio_core::engine::{
    Completion, FileKind, IoEngine, IoFile, Op, Request, RequestError, RwFlags,
};
use aio_core::kit::{EngineCore, Flush, Outcome};
use aio_core::Notifier;
use std::cell::RefCell;
use std::rc::Rc;

mod config;
mod entry;
mod slot_entry;

pub(crate) use config::check_config;
use config::limit_io_workers;
pub use config::{UringConfig, UringStats, MAX_ENTRIES, REGISTERED_FILES};

use io_uring::{opcode, squeue};

use crate::probe::{classify, UringUnavailable};
use crate::registered_buffers::RegisteredBuffers;
use crate::ring::{drain_cq, RingHandle, SharedCore, CANCEL_BIT, ENGINE_BIT};
use crate::task_run::{build_ring, TaskRun};

/// The io_uring engine. See the [crate docs](crate).
///
/// `!Send`: build it on the thread that runs its loop (an `aio_loop::IoThread`
/// does). Its ring may be shared with the loop's monitor (an `Rc`), and with deferred task
/// work (the default) only the thread that set the ring up may enter it
/// (`IORING_SETUP_SINGLE_ISSUER`).
pub struct UringEngine {
    ring: RingHandle,
    notifier: Notifier,
    config: UringConfig,
    core: EngineCore,
    in_kernel: usize,
    /// Registered files: fd -> (index, a clone that keeps the fd number from being reused).
    files: HashMap<RawFd, (u32, IoFile)>,
    files_ready: bool,
    /// The registered-buffer table (None: off, or turned off by `buffers_error`).
    buffers: Option<RegisteredBuffers>,
    /// The registered-buffer slot each in-flight table slot uses.
    buffer_of: Vec<Option<u16>>,
    buffers_error: Option<io::Error>,
    /// The task-work mode the ring runs in (never `Auto`).
    task_run: TaskRun,
    stats: UringStats,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("config", &self.config)
            .field("in_kernel", &self.in_kernel)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl UringEngine {
    /// Sets up the ring and registers its completion eventfd. Settings that cannot work (a
    /// `fixed_buffers` above [`MAX_REGISTERED_BUFFERS`](crate::MAX_REGISTERED_BUFFERS), ...)
    /// are refused first, with [`UringUnavailable::BadConfig`] naming the field.
    pub fn new(config: UringConfig) -> Result<Self, UringUnavailable> {
        check_config(&config)?;
        let entries = config.entries.max(1);
        let (ring, task_run) =
            build_ring(entries, entries * 2, config.task_run).map_err(classify)?;
        let notifier = Notifier::new_eventfd().map_err(UringUnavailable::Other)?;
        limit_io_workers(&ring, &config)?;
        ring.submitter()
            .register_eventfd(notifier.as_raw_fd())
            .map_err(UringUnavailable::Other)?;
        Ok(Self::assemble(
            RingHandle::Own(Box::new(ring)),
            notifier,
            config,
            task_run,
        ))
    }

    /// An engine on a ring shared with a [`UringLoop`](crate::UringLoop): no eventfd, its
    /// completions arrive with the monitor's (see [`shared_ring`](crate::shared_ring)).
    pub(crate) fn on_shared(
        core: Rc<RefCell<SharedCore>>,
        config: UringConfig,
        task_run: TaskRun,
    ) -> Result<Self, UringUnavailable> {
        check_config(&config)?;
        limit_io_workers(&core.borrow().ring, &config)?;
        // Never written: the monitor reports this fd readable itself when completions wait.
        let notifier = Notifier::new_eventfd().map_err(UringUnavailable::Other)?;
        core.borrow_mut().engine_fd = Some(notifier.as_raw_fd());
        Ok(Self::assemble(
            RingHandle::Shared(core),
            notifier,
            config,
            task_run,
        ))
    }

    fn assemble(
        ring: RingHandle,
        notifier: Notifier,
        config: UringConfig,
        task_run: TaskRun,
    ) -> Self {
        let mut files_ready = false;
        if config.register_files {
            files_ready = ring.with(|r| {
                r.submitter()
                    .register_files_sparse(REGISTERED_FILES)
                    .is_ok()
            });
        }
        let (mut buffers, mut buffers_error) = (None, None);
        if config.fixed_buffers > 0 {
            match ring.with(|r| r.submitter().register_buffers_sparse(config.fixed_buffers)) {
                Ok(()) => buffers = Some(RegisteredBuffers::new(config.fixed_buffers)),
                Err(e) => buffers_error = Some(e),
            }
        }
        UringEngine {
            ring,
            notifier,
            config,
            core: EngineCore::new(config.max_batch),
            in_kernel: 0,
            files: HashMap::new(),
            files_ready,
            buffers,
            buffer_of: Vec::new(),
            buffers_error,
            task_run,
            stats: UringStats::default(),
        }
    }

    /// Whether this engine shares its ring with the fd monitor.
    pub fn is_shared(&self) -> bool {
        matches!(self.ring, RingHandle::Shared(_))
    }

    /// The submission-queue entries of the ring set up: [`UringConfig::entries`], or fewer
    /// where the locked-memory limit refused a ring that large (it is halved down to 8).
    pub fn sq_entries(&self) -> u32 {
        self.ring.with(|r| r.params().sq_entries())
    }

    /// The task-work mode the ring runs in: [`UringConfig::task_run`], or what `Auto` chose
    /// on this kernel (never `Auto`).
    pub fn task_run(&self) -> TaskRun {
        self.task_run
    }

    /// Whether the kernel holds completion work for this ring that only an enter runs
    /// (`IORING_SQ_TASKRUN`, in the modes that use it).
    fn task_work_pending(&self) -> bool {
        self.task_run.uses_flag()
            // SAFETY: a transient view of the SQ flags; no SubmissionQueue is alive.
            && self.ring.with(|r| unsafe { r.submission_shared() }.taskrun())
    }

    /// The engine's numbers.
    pub fn stats(&self) -> UringStats {
        self.stats
    }

    /// Requests the kernel holds right now.
    pub fn in_kernel(&self) -> usize {
        self.in_kernel
    }

    /// Why registered buffers are off although `fixed_buffers` asked for them: the kernel
    /// refused the table or a registration (`ENOMEM`: the memlock limit, `RLIMIT_MEMLOCK`).
    pub fn fixed_buffers_error(&self) -> Option<&io::Error> {
        self.buffers_error.as_ref()
    }

    /// Whether the kernel keeps overflowed completions (`IORING_FEAT_NODROP`).
    pub fn nodrop(&self) -> bool {
        self.ring.with(|r| r.params().is_feature_nodrop())
    }

    /// Moves waiting requests (remainders first) into the submission queue and submits them.
    fn submit_pending(&mut self, flush: Flush) {
        // Without IORING_FEAT_NODROP the kernel drops completions that do not fit the CQ:
        // never have more in flight than it holds.
        let cap = if self.nodrop() {
            usize::MAX
        } else {
            self.ring.with(|r| r.params().cq_entries()) as usize
        };
        loop {
            let room = cap.saturating_sub(self.in_kernel);
            let mut round = self.core.begin_round(self.in_kernel, room, flush);
            let mut pushed = 0usize;
            while let Some(slot) = self.core.next_in_round(&mut round) {
                let slot_entry::SlotEntry {
                    sqe: mut entry,
                    fixed_file,
                    fixed_buffer,
                } = self.entry(slot);
                if round.has_room() && round.takes_fresh() && self.range_op_follows(slot) {
                    // Range ops on one file run one after another in one io-wq worker (a hard
                    // link: a failure does not cancel the next), instead of a worker each
                    // queueing on the file's lock (BENCHMARKS.md, "Discard and write-zeroes").
                    entry = entry.flags(squeue::Flags::IO_HARDLINK);
                    self.stats.linked_range_ops += 1;
                }
                // SAFETY: the entry's buffers and iovecs live in `self.table` until its CQE
                // is reaped (or, at Drop, until the kernel is done with them).
                let full = !unsafe { self.ring.try_push(&entry) };
                if full {
                    self.stats.sq_full += 1;
                    self.core.table.unsent(&[slot]);
                    break;
                }
                self.stats.fixed_file_requests += fixed_file as u64;
                self.stats.fixed_buffer_requests += fixed_buffer as u64;
                pushed += 1;
            }
            if pushed == 0 {
                return;
            }
            // Counted from the push: an entry in the SQ belongs to the kernel once any enter
            // consumes it, and its memory is pinned in the table until its CQE.
            self.in_kernel += pushed;
            if self.is_shared() && flush != Flush::All && pushed < round.batch {
                // One ring with the monitor, and less than this round's batch: its next wait
                // enters the kernel anyway and submits these with it. A whole round (by the
                // batch rule, the first request to an idle ring is one) goes now.
                return;
            }
            // EAGAIN / EBUSY / EINTR: the entries stay in the SQ and go with the next enter
            // (the next submit, reap or wait). With its own ring nothing else may come (the
            // kernel may hold nothing but these): wake the loop, whose `poll_completions`
            // submits what waits in the SQ.
            if let Err(e) = self.enter_to_submit() {
                if e.raw_os_error() == Some(libc::EINTR) {
                    self.stats.interrupted_calls += 1;
                }
                if !self.is_shared() {
                    let _ = self.notifier.notify();
                }
                return;
            }
            if pushed < round.batch {
                return;
            }
        }
    }

    /// Reaps the completion queue (flushing kernel-side overflow first).
    fn reap(&mut self) -> usize {
        let mut results: Vec<(u32, i32)> = Vec::new();
        if self.task_work_pending() {
            // The completions exist but are not posted yet: one enter with GETEVENTS (the
            // crate adds it when it sees the flag) runs the work and posts them.
            self.stats.task_run_enters += 1;
            let _ = self.ring.with(|r| r.submit());
        }
        match &mut self.ring {
            RingHandle::Own(ring) => {
                self.stats.cq_overflows += drain_cq(ring, |data, res| {
                    // A cancel's own completion: its target's says what happened.
                    if data & CANCEL_BIT == 0 {
                        results.push((data as u32, res))
                    }
                });
            }
            RingHandle::Shared(shared) => {
                let mut shared = shared.borrow_mut();
                self.stats.cq_overflows += shared.drain();
                results.append(&mut shared.io_results);
                shared.engine_kick = false;
            }
        }
        for &(slot, res) in &results {
            match self.core.table.on_result(slot, res as i64) {
                // Not ours (cannot happen with the user-data split; never miscount for it).
                Outcome::Stale => continue,
                Outcome::Resubmit => self.stats.resubmits += 1,
                Outcome::Completed => self.release_fixed_buffer(slot),
            }
            self.in_kernel -= 1;
        }
        self.stats.cqes += results.len() as u64;
        results.len()
    }

    /// Whether `slot` is a discard or write-zeroes and the next request to go (no remainder
    /// waits) is one on the same file.
    fn range_op_follows(&self, slot: u32) -> bool {
        if self.core.table.has_resubmits() {
            return false;
        }
        let Some(next) = self.core.queue.front() else {
            return false;
        };
        next.op.is_range()
            && self
                .core
                .table
                .range_op_fd(slot)
                .is_some_and(|fd| fd == next.file.raw_fd())
    }

    /// Refuses a block device's discard (an ioctl: no io_uring op runs it on this kernel
    /// interface; [`WithFallback`](aio_core::engine::WithFallback) sends it to a thread pool); counts FUA writes.
    fn check_request(&mut self, request: &Request) -> Result<(), RequestError> {
        if matches!(request.op, Op::Discard { .. }) && request.file.kind() == FileKind::BlockDevice
        {
            return Err(RequestError::Unsupported {
                engine: "uring",
                op: "discard",
                reason: "a block device's discard is the BLKDISCARD ioctl; route it to a \
                         thread pool with aio_core::engine::WithFallback"
                    .into(),
            });
        }
        self.stats.fua_writes += request.flags.contains(RwFlags::FUA) as u64;
        Ok(())
    }

    /// Asks the kernel to cancel the request with `token` (`IORING_OP_ASYNC_CANCEL` on its
    /// user data): if the kernel can stop it, it completes with `ECANCELED`; if not (a block
    /// device read already at the device), it completes normally. False when no request with
    /// that token is in the kernel.
    fn cancel_in_kernel(&mut self, token: u64) -> bool {
        let Some(slot) = self.core.table.slot_of_token(token) else {
            return false;
        };
        let tag = if self.is_shared() { ENGINE_BIT } else { 0 };
        let entry = opcode::AsyncCancel::new(tag | slot as u64)
            .build()
            .user_data(tag | CANCEL_BIT | slot as u64);
        // SAFETY: an ASYNC_CANCEL entry points to no memory.
        let mut pushed = unsafe { self.ring.try_push(&entry) };
        if !pushed {
            // A full SQ: send what is in it, then there is room.
            let _ = self.ring.with(|r| r.submit());
            // SAFETY: as above.
            pushed = unsafe { self.ring.try_push(&entry) };
        }
        if pushed {
            self.stats.cancels_sent += 1;
            let _ = self.enter_to_submit();
        }
        pushed
    }

    /// One `io_uring_enter` that sends what waits in the SQ, counted in `submit_calls` and,
    /// for what the kernel took, `entries_submitted`.
    fn enter_to_submit(&mut self) -> io::Result<usize> {
        self.stats.submit_calls += 1;
        let sent = self.ring.with(|r| r.submit());
        if let Ok(n) = sent {
            self.stats.entries_submitted += n as u64;
        }
        sent
    }

    /// Blocks until at least one completion arrives (drain and drop).
    fn wait_one(&mut self) -> io::Result<()> {
        loop {
            match self.ring.with(|r| r.submit_and_wait(1)) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    self.stats.interrupted_calls += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "uring"
    }

    aio_core::kit::engine_queue_methods!(core: core, send: submit_pending, check: check_request);

    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let reaped = self.reap();
        self.submit_pending(Flush::ByBatchRule);
        if reaped == 0 || !self.is_shared() {
            // Make sure what waits in the SQ (a shared ring's deferred entries, or entries an
            // interrupted enter left behind) reaches the kernel even if no wait follows soon.
            // SAFETY: a transient view of the SQ length.
            let queued = self.ring.with(|r| unsafe { r.submission_shared() }.len());
            if queued > 0 {
                let _ = self.enter_to_submit();
            }
        }
        self.core.take_done(out)
    }

    fn has_completions(&self) -> bool {
        if self.core.table.has_done() {
            return true;
        }
        match &self.ring {
            RingHandle::Own(r) => {
                // SAFETY: a transient view of the CQ; no other CompletionQueue exists meanwhile
                // (every `&mut self` method creates its own and drops it before returning).
                let cq_empty = unsafe { r.completion_shared() }.is_empty();
                // Completions the kernel holds as task work are there too, one enter away.
                !cq_empty || self.task_work_pending()
            }
            RingHandle::Shared(core) => core.try_borrow().is_ok_and(|c| {
                // SAFETY: as above; the monitor is not inside a method (it is not borrowed).
                let cq_empty = unsafe { c.ring.completion_shared() }.is_empty();
                // A second shared borrow of the core, inside this one.
                c.engine_ready() || !cq_empty || self.task_work_pending()
            }),
        }
    }

    fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    fn clear_notifier(&self) {
        // On a shared ring nothing writes the eventfd: the monitor reports it ready from the
        // completion queue, so reading it would be a syscall that always finds nothing.
        if !self.is_shared() {
            self.notifier.test_and_clear();
        }
    }

    fn cancel(&mut self, token: u64) -> bool {
        if self.core.cancel_queued(token) {
            match &self.ring {
                RingHandle::Own(_) => {
                    let _ = self.notifier.notify();
                }
                RingHandle::Shared(core) => core.borrow_mut().engine_kick = true,
            }
            return true;
        }
        self.cancel_in_kernel(token)
    }

    fn drain(&mut self) -> Vec<Completion> {
        let mut out = VecDeque::new();
        loop {
            self.submit_pending(Flush::All);
            self.poll_completions(&mut out);
            if self.in_flight() == 0 {
                return out.into();
            }
            if self.in_kernel > 0 && self.wait_one().is_err() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

impl Drop for UringEngine {
    /// Cancels queued requests and waits for every request the kernel holds: no buffer is
    /// freed while the kernel may still write it.
    fn drop(&mut self) {
        drop(self.core.queue.cancel_all());
        loop {
            // Reap first: on a shared ring the monitor may already hold our completions.
            self.reap();
            if self.in_kernel == 0 {
                break;
            }
            if self.wait_one().is_err() {
                // The kernel cannot tell us when it is done: never free the buffers (abort if
                // any is caller memory).
                std::mem::take(&mut self.core).table.abandon();
                return;
            }
        }
        if let RingHandle::Shared(shared) = &self.ring {
            if self.buffers.is_some() {
                // The ring outlives this engine: unpin our registered buffers now (nothing
                // is in flight any more).
                let _ = shared.borrow().ring.submitter().unregister_buffers();
            }
            // The monitor must stop reporting our (soon closed) notifier fd.
            let mut shared = shared.borrow_mut();
            shared.engine_fd = None;
            shared.engine_kick = false;
            shared.io_results.clear();
        }
    }
}
