//! The engine: `io_setup`, batched `io_submit`, completions read from the kernel's ring.
//!
//! This module owns the AIO context, the iocbs in flight and the submit and completion paths
//! (see the crate docs for the rules); settings, errors and statistics live in their own files.

use std::collections::VecDeque;

use aio_core::engine::{Completion, IoEngine, Op, Request, RequestError, RwFlags};
use aio_core::kit::{BadConfig, EngineCore, Flush, Outcome, Prepared};
use aio_core::Notifier;

use crate::abi::{self, AioContextId, IoEvent, Iocb, Ring};

use crate::{BufferedPolicy, LinuxAioConfig, LinuxAioError, LinuxAioStats};

/// The Linux AIO engine. See the [crate docs](crate).
///
/// `Send` (build it on one thread, run it on another) but not `Sync`: an AIO context belongs
/// to the process, not to a thread, so `io_submit` and the completion ring work from any
/// thread, one at a time (`&mut self`).
pub struct LinuxAio {
    id: AioContextId,
    ring: Option<Ring>,
    notifier: Notifier,
    config: LinuxAioConfig,
    /// Queued requests, requests in the kernel (or waiting to go back for a remainder),
    /// finished completions.
    core: EngineCore,
    in_kernel: usize,
    /// Set by `EAGAIN` from io_submit: wait for a completion before trying again.
    submit_blocked: bool,
    events: Vec<IoEvent>,
    iocbs: Vec<Iocb>,
    iocb_ptrs: Vec<*mut Iocb>,
    batch: Vec<u32>,
    stats: LinuxAioStats,
}

// SAFETY: the raw pointers in the engine are the iocb array it owns (rebuilt per submission)
// and the view of the kernel's completion ring, a mapping of the process's AIO context that
// any thread may read; all of it is used through `&mut self` or atomics, so moving the engine
// to another thread is sound. It is deliberately not `Sync`.
unsafe impl Send for LinuxAio {}

impl std::fmt::Debug for LinuxAio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxAio")
            .field("ring_size", &self.config.ring_size)
            .field("in_kernel", &self.in_kernel)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn read_proc(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable ({e})"))
}

impl LinuxAio {
    /// Creates the AIO context (`io_setup(ring_size)`) and its eventfd.
    pub fn new(config: LinuxAioConfig) -> Result<Self, LinuxAioError> {
        if config.max_batch == 0 {
            let why = "0: at least 1 iocb per io_submit";
            return Err(BadConfig::new("LinuxAioConfig", "max_batch", why).into());
        }
        if config.ring_size == 0 {
            let why = "0: the ring must hold at least 1 event";
            return Err(BadConfig::new("LinuxAioConfig", "ring_size", why).into());
        }
        // IOCB_FLAG_RESFD needs an eventfd; the pipe fallback cannot serve.
        let notifier = Notifier::new_eventfd().map_err(LinuxAioError::Io)?;
        let id = abi::io_setup(config.ring_size).map_err(|e| match e.raw_os_error() {
            Some(libc::EAGAIN) => LinuxAioError::AioMaxNr {
                requested: config.ring_size,
                aio_nr: read_proc("/proc/sys/fs/aio-nr"),
                aio_max_nr: read_proc("/proc/sys/fs/aio-max-nr"),
            },
            Some(libc::ENOSYS) | Some(libc::EPERM) => LinuxAioError::Unavailable(e),
            _ => LinuxAioError::Io(e),
        })?;
        // SAFETY: `id` is a live context; the Ring is dropped with the engine, before
        // io_destroy in Drop (it holds no ownership, only the address).
        let ring = unsafe { Ring::new(id) };
        let cap = config.ring_size as usize;
        Ok(LinuxAio {
            id,
            ring,
            notifier,
            config,
            core: EngineCore::new(config.max_batch),
            in_kernel: 0,
            submit_blocked: false,
            events: Vec::with_capacity(cap.min(4096)),
            iocbs: Vec::with_capacity(config.max_batch.max(1)),
            iocb_ptrs: Vec::with_capacity(config.max_batch.max(1)),
            batch: Vec::with_capacity(config.max_batch.max(1)),
            stats: LinuxAioStats::default(),
        })
    }

    /// The engine's numbers.
    pub fn stats(&self) -> LinuxAioStats {
        self.stats
    }

    /// Whether completions are read from the user-space ring (true on every kernel whose
    /// ring layout this crate knows) rather than with `io_getevents`.
    pub fn reads_ring_in_user_space(&self) -> bool {
        self.ring.is_some()
    }

    /// Requests the kernel holds right now.
    pub fn in_kernel(&self) -> usize {
        self.in_kernel
    }

    /// Fills the iocb for a slot from what is left of its transfer.
    fn build_iocb(&mut self, slot: u32) -> Iocb {
        let resfd = std::os::fd::AsRawFd::as_raw_fd(&self.notifier) as u32;
        let mut iocb = Iocb {
            aio_data: slot as u64,
            aio_flags: abi::IOCB_FLAG_RESFD,
            aio_resfd: resfd,
            ..Iocb::default()
        };
        match self.core.table.prepare(slot).expect("live slot") {
            Prepared::Sync { fd, datasync } => {
                iocb.aio_fildes = fd as u32;
                iocb.aio_lio_opcode = if datasync {
                    abi::IOCB_CMD_FDSYNC
                } else {
                    abi::IOCB_CMD_FSYNC
                };
            }
            Prepared::Range { .. } => {
                unreachable!("check_request refuses discard and write-zeroes at submit")
            }
            Prepared::Rw(rw) => {
                iocb.aio_fildes = rw.fd as u32;
                iocb.aio_offset = rw.offset as i64;
                iocb.aio_rw_flags = rw.rw_flags;
                if rw.count == 1 {
                    // SAFETY: `iovecs` points to `count` (= 1) live iovecs in the table.
                    let single = unsafe { *rw.iovecs };
                    iocb.aio_lio_opcode = if rw.is_read {
                        abi::IOCB_CMD_PREAD
                    } else {
                        abi::IOCB_CMD_PWRITE
                    };
                    iocb.aio_buf = single.iov_base as u64;
                    iocb.aio_nbytes = single.iov_len as u64;
                } else {
                    iocb.aio_lio_opcode = if rw.is_read {
                        abi::IOCB_CMD_PREADV
                    } else {
                        abi::IOCB_CMD_PWRITEV
                    };
                    iocb.aio_buf = rw.iovecs as u64;
                    iocb.aio_nbytes = rw.count as u64;
                }
            }
        }
        iocb
    }

    /// Sends what waits (resubmissions first, then new requests) while the ring has room.
    fn submit_pending(&mut self, flush: Flush) {
        let capacity = self.config.ring_size as usize;
        while !self.submit_blocked && self.in_kernel < capacity {
            let mut round = self
                .core
                .begin_round(self.in_kernel, capacity - self.in_kernel, flush);
            self.batch.clear();
            while let Some(slot) = self.core.next_in_round(&mut round) {
                self.batch.push(slot);
            }
            if self.batch.is_empty() {
                return;
            }
            self.iocbs.clear();
            for i in 0..self.batch.len() {
                let iocb = self.build_iocb(self.batch[i]);
                self.iocbs.push(iocb);
            }
            self.iocb_ptrs.clear();
            let base = self.iocbs.as_mut_ptr();
            for i in 0..self.iocbs.len() {
                // SAFETY: `i < iocbs.len()`; the pointers live until io_submit returns.
                self.iocb_ptrs.push(unsafe { base.add(i) });
            }
            self.stats.submit_calls += 1;
            // SAFETY: every iocb points into buffers owned by `self.table`, which keeps them
            // (neither moved nor dropped) until their event is reaped or, in Drop, until the
            // kernel has finished with them.
            let result = unsafe { abi::io_submit(self.id, &mut self.iocb_ptrs) };
            match result {
                Ok(sent) => {
                    self.in_kernel += sent;
                    self.stats.iocbs_submitted += sent as u64;
                    // A partial submission: the unsent tail waits at the front, in order (the
                    // next io_submit reports what stopped it).
                    self.core.table.unsent(&self.batch[sent..]);
                    if sent == 0 {
                        return;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) => {
                    if e.raw_os_error() == Some(libc::EINTR) {
                        self.stats.interrupted_calls += 1;
                    } else {
                        self.stats.submit_eagain += 1;
                    }
                    self.core.table.unsent(&self.batch);
                    // Retry once a completion frees kernel resources (or, with nothing in
                    // the kernel, on the next poll: wake the loop so that it comes).
                    self.submit_blocked = true;
                    if self.in_kernel == 0 {
                        let _ = self.notifier.notify();
                    }
                    return;
                }
                Err(e) => {
                    // The head request is bad; the others go on.
                    self.stats.submit_errors += 1;
                    let head = self.batch[0];
                    self.core.table.unsent(&self.batch[1..]);
                    self.core.table.complete(head, Err(e));
                    let _ = self.notifier.notify();
                }
            }
        }
    }

    /// Handles reaped kernel events.
    fn process_events(&mut self) {
        for i in 0..self.events.len() {
            let ev = self.events[i];
            self.in_kernel -= 1;
            self.submit_blocked = false;
            if self.core.table.on_result(ev.data as u32, ev.res) == Outcome::Resubmit {
                self.stats.resubmits += 1;
            }
        }
        self.events.clear();
    }

    /// Reaps without blocking: from the ring, or with `io_getevents(0)`.
    fn reap(&mut self) -> usize {
        if self.in_kernel == 0 {
            return 0;
        }
        self.events.clear();
        let n = match &self.ring {
            Some(ring) => {
                let n = ring.reap(&mut self.events, self.in_kernel);
                self.stats.ring_events += n as u64;
                n
            }
            None => self.getevents(
                0,
                Some(libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                }),
            ),
        };
        if n > 0 {
            self.process_events();
        }
        n
    }

    /// `io_getevents` into `self.events` (retrying EINTR); returns the count.
    fn getevents(&mut self, min: usize, timeout: Option<libc::timespec>) -> usize {
        let max = self.in_kernel.max(1);
        let mut buf = vec![IoEvent::default(); max];
        loop {
            self.stats.getevents_calls += 1;
            match abi::io_getevents(self.id, min, &mut buf, timeout) {
                Ok(n) => {
                    self.events.clear();
                    self.events.extend_from_slice(&buf[..n]);
                    return n;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    self.stats.interrupted_calls += 1;
                }
                Err(_) => return 0,
            }
        }
    }

    /// Blocks until at least one kernel event arrives and handles it.
    fn wait_one(&mut self) {
        if self.in_kernel == 0 {
            return;
        }
        if self.getevents(1, None) > 0 {
            self.process_events();
        }
    }

    /// Refuses what Linux AIO cannot run (discard, write-zeroes) and applies the buffered
    /// policy; counts FUA writes.
    fn check_request(&mut self, request: &Request) -> Result<(), RequestError> {
        if request.op.is_range() {
            return Err(RequestError::Unsupported {
                engine: "linux-aio",
                op: request.op.name(),
                reason: "the kernel's AIO has no fallocate; route it to a thread pool with \
                         aio_core::engine::WithFallback, as QEMU does with aio=native"
                    .into(),
            });
        }
        if matches!(request.op, Op::Fsync | Op::Fdatasync) {
            return Ok(());
        }
        self.stats.fua_writes += request.flags.contains(RwFlags::FUA) as u64;
        if request.file.is_direct() {
            return Ok(());
        }
        match self.config.buffered {
            BufferedPolicy::Refuse => Err(RequestError::Unsupported {
                engine: "linux-aio",
                op: request.op.name(),
                reason: format!(
                    "fd {} is not opened with O_DIRECT; Linux AIO would block in io_submit \
                     (BufferedPolicy::Refuse)",
                    request.file.raw_fd()
                ),
            }),
            BufferedPolicy::Count => {
                self.stats.buffered_requests += 1;
                Ok(())
            }
        }
    }
}

impl IoEngine for LinuxAio {
    fn name(&self) -> &'static str {
        "linux-aio"
    }

    aio_core::kit::engine_queue_methods!(core: core, send: submit_pending, check: check_request);

    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        self.reap();
        if self.in_kernel == 0 {
            // Blocked by EAGAIN with nothing in the kernel to wait for: try again now.
            self.submit_blocked = false;
        }
        self.submit_pending(Flush::ByBatchRule);
        self.core.take_done(out)
    }

    fn has_completions(&self) -> bool {
        self.core.table.has_done() || self.ring.as_ref().is_some_and(|r| r.has_events())
    }

    fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    fn cancel(&mut self, token: u64) -> bool {
        let cancelled = self.core.cancel_queued(token);
        if cancelled {
            let _ = self.notifier.notify();
        }
        cancelled
    }

    fn drain(&mut self) -> Vec<Completion> {
        let mut out = VecDeque::new();
        loop {
            self.submit_blocked = false;
            self.submit_pending(Flush::All);
            self.poll_completions(&mut out);
            if self.in_flight() == 0 {
                return out.into();
            }
            if self.in_kernel > 0 {
                self.wait_one();
            } else if self.core.queue.is_empty() && !self.core.table.has_resubmits() {
                // Nothing anywhere but the count says otherwise: completions are in `done`.
                continue;
            } else {
                // EAGAIN with nothing in the kernel: back off briefly.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

impl Drop for LinuxAio {
    /// Cancels queued requests and waits for every request the kernel holds: no buffer is
    /// freed while the kernel may still write it.
    fn drop(&mut self) {
        drop(self.core.queue.cancel_all());
        while self.in_kernel > 0 {
            let before = self.in_kernel;
            self.wait_one();
            if self.in_kernel == before {
                // io_getevents failed: the kernel cannot tell us, so the buffers must never
                // be freed. Leak them (abort if any is caller memory) rather than risk the
                // kernel writing freed memory.
                std::mem::take(&mut self.core.table).abandon();
                break;
            }
        }
        // Remainders that were waiting to go back are not in the kernel: dropping is safe.
        self.ring = None;
        let _ = abi::io_destroy(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio_conformance::engine::{wait_for, TempFile, BLOCK};

    /// A request's flags are the iocb's `aio_rw_flags` that `io_submit` gets: a FUA write
    /// carries `RWF_DSYNC`, a NOWAIT read `RWF_NOWAIT`, a request without flags none, and a
    /// sync never any. The iocbs are the engine's last batch, read after the submission. (The
    /// kernel's behaviour cannot show it: a FUA write completes like any other, and whether a
    /// NOWAIT read would block depends on the page cache.)
    #[test]
    fn request_flags_reach_the_iocb() {
        if aio_conformance::available("Linux AIO unavailable", crate::probe()).is_none() {
            return;
        }
        let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
        let tmp = TempFile::with_len(4 * BLOCK, 1);
        let file = tmp.open_direct_or_say();
        let mut cases = aio_conformance::engine::requests_with_rw_flags(&file);
        cases.push((Request::fdatasync(&file, 7), 0));
        for (request, rwf) in cases {
            let token = request.token;
            engine.submit(request).unwrap();
            assert_eq!(engine.iocbs.len(), 1, "request {token} went out alone");
            assert_eq!(
                engine.iocbs[0].aio_rw_flags as libc::c_int, rwf,
                "request {token}"
            );
            wait_for(&mut engine, 1);
        }
    }
}
