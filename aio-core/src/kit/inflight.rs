//! The in-flight table kernel-queue engines share (Linux AIO, io_uring).
//!
//! This module owns the requests an engine has handed to the kernel, or that wait to go back
//! for the remainder of a short transfer: their slots, the resubmission order, the mapping of a
//! kernel result (`res`, bytes or `-errno`) to "done", "again" or "failed", and the finished
//! completions. It never calls the kernel; engines build their submission entries from
//! [`InFlightTable::prepare`] and feed results to [`InFlightTable::on_result`].
//!
//! Memory: an entry's buffers (and the iovec array built for it) stay in the table, neither
//! moved nor dropped, until [`InFlightTable::on_result`] completes it; an engine must not drop
//! the table while the kernel holds entries (see the engines' `Drop`).

use std::collections::VecDeque;
use std::io;

use super::blocking::RangeOp;
use super::transfer::{Step, Transfer};
use crate::engine::{Completion, Op, Request, RwFlags};
use crate::slots::Slots;

/// A request the kernel holds, or that waits to go back to it for its remainder.
#[derive(Debug)]
struct InFlight {
    request: Request,
    transfer: Transfer,
    iovecs: Vec<libc::iovec>,
}

// SAFETY: the iovecs point into the request's own memory (its owned buffers, or guest memory
// whose `LentMemory` is `Send` by its constructor's contract); moving the entry to another
// thread moves that memory's owner with them, and nothing else holds the pointers.
unsafe impl Send for InFlight {}

/// What to put in a submission entry for a slot.
#[derive(Debug, Clone, Copy)]
pub enum Prepared {
    /// `fsync` (`datasync` false) or `fdatasync` (true).
    Sync {
        /// The fd.
        fd: i32,
        /// fdatasync rather than fsync.
        datasync: bool,
    },
    /// A read or write of what is left.
    Rw(PreparedRw),
    /// A discard or write-zeroes.
    Range {
        /// The fd.
        fd: i32,
        /// How the kernel runs it on this file.
        how: RangeOp,
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// What is left of a read or write, as its engine hands it to the kernel.
#[derive(Debug, Clone, Copy)]
pub struct PreparedRw {
    /// The fd.
    pub fd: i32,
    /// Reads into memory.
    pub is_read: bool,
    /// File offset of the remainder.
    pub offset: u64,
    /// The iovec array (valid until the slot completes).
    pub iovecs: *const libc::iovec,
    /// How many iovecs (at least one).
    pub count: usize,
    /// The request's `RWF_*` flags ([`RwFlags::to_rwf`]).
    pub rw_flags: libc::c_int,
}

/// The whole buffer of an in-flight read or write ([`InFlightTable::single_buffer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeBuffer {
    /// The allocation's [`AlignedBuf::id`](crate::engine::AlignedBuf::id).
    pub id: u64,
    /// Its first byte.
    pub ptr: *const u8,
    /// Its length.
    pub len: usize,
}

/// What a kernel result meant for its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Completed (its completion is in the done queue).
    Completed,
    /// Short, `-EAGAIN` or `-EINTR`: queued for resubmission.
    Resubmit,
    /// The slot was not live (a stale result); ignored.
    Stale,
}

/// Slots for requests in the kernel's hands, or waiting to go back to it for the remainder of
/// a short transfer.
///
/// Memory: an entry's buffers (and the iovec array built for it) stay in the table, neither
/// moved nor dropped, until [`InFlightTable::on_result`] completes it; an engine must not drop
/// the table while the kernel holds entries (see the engines' `Drop`).
///
/// A slot's index is the kernel's user data: the request owns the slot until it completes, so
/// the index alone names it (a result for a freed slot is [`Outcome::Stale`]).
#[derive(Debug, Default)]
pub struct InFlightTable {
    slots: Slots<InFlight>,
    resubmit: VecDeque<u32>,
    done: VecDeque<Completion>,
}

impl InFlightTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a request in; returns its slot (use it as the kernel's user data).
    pub fn insert(&mut self, request: Request) -> u32 {
        self.slots
            .insert(InFlight {
                request,
                transfer: Transfer::default(),
                iovecs: Vec::new(),
            })
            .index()
    }

    /// Requests in the table (in the kernel or waiting to go back).
    pub fn live(&self) -> usize {
        self.slots.len()
    }

    /// The file of a live slot (a clone: it keeps the fd open).
    pub fn file(&self, slot: u32) -> Option<crate::engine::IoFile> {
        self.slots.get_index(slot).map(|e| e.request.file.clone())
    }

    /// The whole buffer of a live single-buffer read or write (None for vectored requests and
    /// syncs): what an engine registers with the kernel for fixed-buffer I/O. The memory stays
    /// where it is until the slot completes.
    pub fn single_buffer(&self, slot: u32) -> Option<WholeBuffer> {
        match &self.slots.get_index(slot)?.request.op {
            Op::Read { buf, .. } | Op::Write { buf, .. } => Some(WholeBuffer {
                id: buf.id(),
                ptr: buf.as_ptr(),
                len: buf.len(),
            }),
            _ => None,
        }
    }

    /// The fd of a live slot whose request is a discard or write-zeroes.
    pub fn range_op_fd(&self, slot: u32) -> Option<i32> {
        let entry = self.slots.get_index(slot)?;
        entry
            .request
            .op
            .is_range()
            .then(|| entry.request.file.raw_fd())
    }

    /// The slot of the live request with `token` that is in the kernel (not waiting to go
    /// back for a remainder), if any. A linear search: for cancels, not for every request.
    pub fn slot_of_token(&self, token: u64) -> Option<u32> {
        let (id, _) = self.slots.iter().find(|(_, e)| e.request.token == token)?;
        let slot = id.index();
        (!self.resubmit.contains(&slot)).then_some(slot)
    }

    /// Describes what to submit for `slot` (the remainder of its transfer).
    pub fn prepare(&mut self, slot: u32) -> Option<Prepared> {
        let entry = self.slots.get_index_mut(slot)?;
        let fd = entry.request.file.raw_fd();
        let op = &mut entry.request.op;
        Some(match op {
            Op::Fsync => Prepared::Sync {
                fd,
                datasync: false,
            },
            Op::Fdatasync => Prepared::Sync { fd, datasync: true },
            Op::Discard { .. } | Op::WriteZeroes { .. } => Prepared::Range {
                fd,
                how: RangeOp::of(op, entry.request.file.kind()).expect("a range op"),
                offset: op.offset(),
                len: op.range_len(),
            },
            _ => {
                let is_read = op.is_read();
                entry.transfer.remaining_iovecs(op, &mut entry.iovecs);
                Prepared::Rw(PreparedRw {
                    fd,
                    is_read,
                    offset: entry.transfer.offset(op),
                    iovecs: entry.iovecs.as_ptr(),
                    count: entry.iovecs.len(),
                    rw_flags: entry.request.flags.to_rwf(),
                })
            }
        })
    }

    /// Applies a kernel result (`res`: bytes, or `-errno`) to `slot`.
    pub fn on_result(&mut self, slot: u32, res: i64) -> Outcome {
        let Some(entry) = self.slots.get_index_mut(slot) else {
            return Outcome::Stale;
        };
        if res < 0 {
            let e = (-res) as i32;
            // NOWAIT asked for EAGAIN to be reported, not waited out.
            let report_eagain = entry.request.flags.contains(RwFlags::NOWAIT);
            if e == libc::EINTR || (e == libc::EAGAIN && !report_eagain) {
                self.resubmit.push_back(slot);
                return Outcome::Resubmit;
            }
            self.complete(slot, Err(io::Error::from_raw_os_error(e)));
            return Outcome::Completed;
        }
        if matches!(entry.request.op, Op::Fsync | Op::Fdatasync) {
            self.complete(slot, Ok(0));
            return Outcome::Completed;
        }
        match entry.transfer.advance(&entry.request.op, res as usize) {
            Ok(Step::Done(total)) => self.complete(slot, Ok(total)),
            Ok(Step::Again) => {
                self.resubmit.push_back(slot);
                return Outcome::Resubmit;
            }
            Err(e) => self.complete(slot, Err(e)),
        }
        Outcome::Completed
    }

    /// Whether any request in the table reads or writes caller-owned memory
    /// ([`LentMemory`](crate::engine::LentMemory)): an engine that cannot wait for the
    /// kernel must then abort rather than leak (see [`InFlightTable::abandon`]).
    pub fn holds_guest_memory(&self) -> bool {
        self.slots
            .iter()
            .any(|(_, e)| matches!(e.request.op, Op::ReadGuest { .. } | Op::WriteGuest { .. }))
    }

    /// What an engine does when it cannot learn whether the kernel is done with the table's
    /// requests (its wait failed): the buffers are leaked, never freed, since the kernel may
    /// still write them; if any request's memory is the caller's, the process aborts, since
    /// the caller would free or reuse it after the engine's drop returned.
    pub fn abandon(self) {
        if self.holds_guest_memory() {
            // A library never prints, except on the way to an abort that has to be explained.
            eprintln!(
                "aio-core: the kernel may still write caller-owned memory of a request in \
                 flight and cannot be waited for; aborting"
            );
            std::process::abort();
        }
        std::mem::forget(self);
    }

    /// Completes `slot` with `result`, freeing it.
    pub fn complete(&mut self, slot: u32, result: io::Result<usize>) {
        if let Some(entry) = self.slots.remove_index(slot) {
            self.done.push_back(entry.request.complete(result));
        }
    }

    /// Queues a completion that never reached the kernel (a cancel, a refusal).
    pub fn push_done(&mut self, completion: Completion) {
        self.done.push_back(completion);
    }

    /// The next slot to resubmit.
    pub fn pop_resubmit(&mut self) -> Option<u32> {
        self.resubmit.pop_front()
    }

    /// Puts slots that could not be sent back at the head, keeping their order.
    pub fn unsent(&mut self, slots: &[u32]) {
        for &slot in slots.iter().rev() {
            self.resubmit.push_front(slot);
        }
    }

    /// Whether slots wait for resubmission.
    pub fn has_resubmits(&self) -> bool {
        !self.resubmit.is_empty()
    }

    /// Whether completions wait to be handed out.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Moves the finished completions to `out`; returns how many.
    pub fn take_done(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }
}

/// The bookkeeping every engine repeats around its kernel interface: the plug/batch queue of
/// accepted requests, the in-flight table, and the accepted/returned counts behind
/// [`IoEngine::in_flight`](crate::engine::IoEngine::in_flight).
#[derive(Debug, Default)]
pub struct EngineCore {
    /// Accepted, not yet sent.
    pub queue: super::queue::SubmitQueue,
    /// Sent (or waiting to go back for a remainder), and finished completions.
    pub table: InFlightTable,
    accepted: u64,
    returned: u64,
}

impl EngineCore {
    /// An empty core sending at most `max_batch` requests per submission.
    pub fn new(max_batch: usize) -> Self {
        let mut queue = super::queue::SubmitQueue::new();
        queue.set_max_batch(max_batch);
        EngineCore {
            queue,
            table: InFlightTable::new(),
            accepted: 0,
            returned: 0,
        }
    }

    /// Validates and queues a request (the engine then sends what it can).
    pub fn accept(&mut self, request: Request) -> Result<(), crate::engine::SubmitError> {
        if let Err(e) = request.validate() {
            return Err(crate::engine::SubmitError::new(e, request));
        }
        self.accepted += 1;
        self.queue.push(request);
        Ok(())
    }

    /// Cancels a request still queued: its `ECANCELED` completion joins the finished ones.
    /// The engine must then make sure the loop comes for it (signal its notifier).
    pub fn cancel_queued(&mut self, token: u64) -> bool {
        match self.queue.cancel(token) {
            Some(c) => {
                self.table.push_done(c);
                true
            }
            None => false,
        }
    }

    /// Moves finished completions to `out`, counting them as returned.
    pub fn take_done(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let n = self.table.take_done(out);
        self.returned += n as u64;
        n
    }

    /// Accepted requests whose completion has not been returned.
    pub fn in_flight(&self) -> usize {
        (self.accepted - self.returned) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{AlignedBuf, IoFile};

    fn file() -> IoFile {
        IoFile::new(std::fs::File::open("/dev/null").expect("/dev/null"))
    }

    #[test]
    fn bookkeeping_of_remainders_retries_and_completions() {
        let f = file();
        let mut table = InFlightTable::new();
        let read = table.insert(Request::readv(
            &f,
            100,
            vec![AlignedBuf::new(10), AlignedBuf::new(20)],
            1,
        ));
        let sync = table.insert(Request::fsync(&f, 2));
        assert_eq!(table.live(), 2);
        assert_eq!(table.slot_of_token(1), Some(read));
        // The whole transfer first: two iovecs over the two buffers.
        let Some(Prepared::Rw(PreparedRw { count, offset, .. })) = table.prepare(read) else {
            panic!("a read")
        };
        assert_eq!((count, offset), (2, 100));
        // Short: the remainder goes back, from the right offset, over the right bytes.
        assert_eq!(table.on_result(read, 15), Outcome::Resubmit);
        assert_eq!(
            table.slot_of_token(1),
            None,
            "waiting to go back, not in the kernel"
        );
        assert_eq!(table.pop_resubmit(), Some(read));
        let Some(Prepared::Rw(PreparedRw {
            count,
            offset,
            iovecs,
            ..
        })) = table.prepare(read)
        else {
            panic!("a read")
        };
        // SAFETY: `iovecs` points to `count` iovecs the table keeps until the slot completes.
        let first = unsafe { *iovecs };
        assert_eq!((count, offset, first.iov_len), (1, 115, 15));
        // EAGAIN is retried, an error completes, the rest finishes the transfer.
        assert_eq!(
            table.on_result(read, -(libc::EAGAIN as i64)),
            Outcome::Resubmit
        );
        assert_eq!(table.pop_resubmit(), Some(read));
        assert_eq!(
            table.on_result(read, -(libc::EINTR as i64)),
            Outcome::Resubmit,
            "EINTR is retried too"
        );
        assert_eq!(table.pop_resubmit(), Some(read));
        assert_eq!(table.on_result(read, 15), Outcome::Completed);
        assert_eq!(
            table.on_result(sync, -(libc::EIO as i64)),
            Outcome::Completed
        );
        assert_eq!(table.on_result(sync, 0), Outcome::Stale, "a freed slot");
        let mut out = VecDeque::new();
        assert_eq!(table.take_done(&mut out), 2);
        assert_eq!(out[0].result.as_ref().ok(), Some(&30));
        assert_eq!(out[0].buf.count(), 2, "the buffers come back");
        assert_eq!(out[1].errno(), Some(libc::EIO));
        assert_eq!(table.live(), 0);
    }

    #[test]
    fn a_nowait_eagain_is_reported_not_retried() {
        let f = file();
        let mut table = InFlightTable::new();
        let read =
            table.insert(Request::read(&f, 0, AlignedBuf::new(512), 7).with_flags(RwFlags::NOWAIT));
        assert_eq!(
            table.on_result(read, -(libc::EAGAIN as i64)),
            Outcome::Completed,
            "NOWAIT asked for EAGAIN, not a wait"
        );
        assert_eq!(table.pop_resubmit(), None);
        let mut out = VecDeque::new();
        assert_eq!(table.take_done(&mut out), 1);
        assert_eq!((out[0].token, out[0].errno()), (7, Some(libc::EAGAIN)));
        // EINTR is still retried for a NOWAIT request: it says nothing about blocking.
        let again =
            table.insert(Request::read(&f, 0, AlignedBuf::new(512), 8).with_flags(RwFlags::NOWAIT));
        assert_eq!(
            table.on_result(again, -(libc::EINTR as i64)),
            Outcome::Resubmit
        );
    }

    #[test]
    fn flags_reach_the_prepared_request() {
        let f = file();
        let mut table = InFlightTable::new();
        let fua =
            table.insert(Request::write(&f, 0, AlignedBuf::new(512), 1).with_flags(RwFlags::FUA));
        let nowait =
            table.insert(Request::read(&f, 0, AlignedBuf::new(512), 2).with_flags(RwFlags::NOWAIT));
        let plain = table.insert(Request::read(&f, 0, AlignedBuf::new(512), 3));
        let flags = |table: &mut InFlightTable, slot| match table.prepare(slot) {
            Some(Prepared::Rw(rw)) => rw.rw_flags,
            _ => panic!("a read or write"),
        };
        assert_eq!(
            flags(&mut table, fua),
            libc::RWF_DSYNC,
            "FUA is RWF_DSYNC for the kernel"
        );
        assert_eq!(flags(&mut table, nowait), libc::RWF_NOWAIT);
        assert_eq!(flags(&mut table, plain), 0);
        // A remainder keeps the flags.
        assert_eq!(table.on_result(fua, 100), Outcome::Resubmit);
        assert_eq!(table.pop_resubmit(), Some(fua));
        assert_eq!(flags(&mut table, fua), libc::RWF_DSYNC);
    }

    #[test]
    fn remainders_waiting_to_go_back_are_told_apart() {
        let f = file();
        let mut table = InFlightTable::new();
        let read = table.insert(Request::read(&f, 0, AlignedBuf::new(512), 1));
        assert!(!table.has_resubmits());
        assert_eq!(table.on_result(read, 100), Outcome::Resubmit, "short");
        assert!(table.has_resubmits(), "the remainder waits to go back");
        assert_eq!(table.pop_resubmit(), Some(read));
        assert!(!table.has_resubmits(), "sent again");
        assert!(!table.has_done());
        assert_eq!(table.on_result(read, 412), Outcome::Completed);
        assert!(table.has_done(), "the completion waits to be handed out");
        assert_eq!(table.take_done(&mut VecDeque::new()), 1);
        assert!(!table.has_done());
    }

    #[test]
    fn guest_memory_is_seen_while_its_request_is_live() {
        let f = file();
        let mut table = InFlightTable::new();
        let plain = table.insert(Request::read(&f, 0, AlignedBuf::new(512), 1));
        assert!(
            !table.holds_guest_memory(),
            "an AlignedBuf is the table's own"
        );
        let mut memory = vec![0u8; 512];
        // SAFETY: `memory` outlives the request, which completes below and is never submitted.
        let mem = unsafe { crate::engine::LentMemory::new([(memory.as_mut_ptr(), 512)], None) };
        let guest = table.insert(Request::read_guest(&f, 0, mem, 2));
        assert!(table.holds_guest_memory());
        table.complete(guest, Ok(512));
        assert!(
            !table.holds_guest_memory(),
            "completed: the memory is the caller's again"
        );
        table.complete(plain, Ok(512));
        drop(memory);
    }

    #[test]
    fn an_abandoned_table_frees_nothing() {
        use std::os::fd::AsRawFd;
        // The request's file is the table's last handle on it: a table dropped would close it.
        let tmp = tempfile::tempfile().expect("a temporary file");
        let raw = tmp.as_raw_fd();
        let f = IoFile::new(tmp);
        let mut table = InFlightTable::new();
        table.insert(Request::read(&f, 0, AlignedBuf::new(512), 1));
        drop(f);
        table.abandon();
        // SAFETY: F_GETFD only reads the descriptor's flags; `raw` was never closed (the
        // abandoned table keeps its file open for good).
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
        assert_ne!(
            flags, -1,
            "the abandoned request's file was closed: the table was freed"
        );
    }
}
