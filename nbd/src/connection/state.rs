//! What a connection holds: its phase, input, output, requests in flight and what it
//! serves once it has chosen an export.
//!
//! This module owns the connection's types and their small methods; reading and ending are
//! `mod.rs`'s, running requests `transmit.rs`'s.

use std::cell::{Cell, OnceCell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio_block::request::ReturnedBuf;
use aio_block::stats::{Accounted, Recorder};
use aio_block::{BlockRequest, ImageQueue};
use aio_core::engine::{AlignedBuf, IoEngine};
use aio_core::EventLoop;
use aio_loop::AttachedEngine;
use aio_loop::{BottomHalf, DeferredCall, TimerId};

use super::outbox::Outbox;
use super::tls::TlsSession;
use crate::export::NbdExport;
use crate::meta::MetaContexts;
use crate::negotiate::{Negotiation, ReplyStyle};
use crate::reply::Answering;
use crate::server::Shared;
use crate::stream::Stream;

/// The input buffer's size; an option longer than this is skipped and refused.
pub(super) const INBOX: usize = 64 << 10;

/// Where the byte stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    ClientFlags,
    OptionHeader,
    OptionPayload { option: u32, len: usize },
    SkipOption { option: u32, left: u64 },
    Transmit,
    Closed,
}

/// Received bytes not yet used.
pub(super) struct Inbox {
    pub(super) buf: Box<[u8]>,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// The most bytes of buffers a busy connection keeps for its next requests: the default
/// `max_held_bytes`, what its requests may hold at once anyway. Less made a copy whose
/// requests in flight outgrew it (`nbdcopy`: 64 of 256 KiB per connection) allocate, fault in,
/// zero and unmap half its buffers again each round (an `mmap` and `munmap` per request).
const POOL_BYTES: usize = 64 << 20;

/// What an idle connection keeps (nothing in flight, nothing to send): enough for a
/// client at low depth, not the peak of a copy that has ended.
const IDLE_POOL_BYTES: usize = 8 << 20;

/// Buffers of ended requests, kept for the next ones of the same size: a read or write
/// buffer allocated afresh each time costs its pages' faults and zeroing (the most of an
/// `nbdcopy`'s CPU before they were kept). A kept buffer is always overwritten whole before
/// anything of it is sent or written: by the read, or by the client's payload.
#[derive(Default)]
pub(super) struct BufPool {
    free: Vec<AlignedBuf>,
    bytes: usize,
}

impl BufPool {
    /// A buffer of `len` bytes: a kept one, or a new one.
    pub(super) fn take(&mut self, len: usize) -> AlignedBuf {
        match self.free.iter().rposition(|b| b.len() == len) {
            Some(i) => {
                self.bytes -= len;
                self.free.swap_remove(i)
            }
            None => AlignedBuf::new(len),
        }
    }

    /// Keeps `buf` for a next request, if there is room.
    pub(super) fn give(&mut self, buf: AlignedBuf) {
        if self.bytes + buf.len() <= POOL_BYTES {
            self.bytes += buf.len();
            self.free.push(buf);
        }
    }

    /// Frees kept buffers down to what an idle connection keeps, the oldest first.
    pub(super) fn trim_idle(&mut self) {
        let mut oldest = 0;
        while self.bytes > IDLE_POOL_BYTES && oldest < self.free.len() {
            self.bytes -= self.free[oldest].len();
            oldest += 1;
        }
        self.free.drain(..oldest);
    }

    /// Bytes of buffers kept.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl State {
    /// Whether bytes wait for the socket to take them (replies, or TLS records).
    pub(super) fn write_blocked(&self) -> bool {
        self.outbox.is_blocked() || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }
}

impl Inbox {
    pub(super) fn new() -> Self {
        Inbox {
            buf: vec![0; INBOX].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Reads what the socket has into the free space (moving what is left to the front).
    pub(super) fn fill(
        &mut self,
        read: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let n = read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }
}

/// A write whose payload is being received into its buffer.
pub(super) struct PendingWrite {
    pub(super) slot: u16,
    pub(super) buf: AlignedBuf,
    pub(super) filled: usize,
    pub(super) offset: u64,
    pub(super) fua: bool,
}

/// A connection's mutable state.
pub(super) struct State {
    pub(super) phase: Phase,
    pub(super) inbox: Inbox,
    pub(super) negotiation: Negotiation,
    pub(super) outbox: Outbox,
    pub(super) slots: Slots,
    /// Bytes of the buffers of requests in flight.
    pub(super) buffered: usize,
    pub(super) pending_write: Option<PendingWrite>,
    /// Payload bytes to read and drop (a refused write's).
    pub(super) skip: u64,
    /// Read no more; close once drained.
    pub(super) ending: bool,
    /// The socket failed: close now.
    pub(super) broken: bool,
    /// Reading stopped at a limit with input possibly waiting.
    pub(super) stalled: bool,
    /// Reading is to start again from the bottom half (after a stall, or TLS starting).
    pub(super) resume: bool,
    /// `NBD_OPT_STARTTLS` was acknowledged: TLS starts once the acknowledgement is sent.
    pub(super) tls_pending: bool,
    /// The TLS session, once started.
    pub(super) tls: Option<TlsSession>,
    /// Buffers kept for the next requests.
    pub(super) pool: BufPool,
    /// Slots whose write or discard succeeded and whose FUA flush is to be sent.
    pub(super) resubmit: Vec<u16>,
    /// The connection itself, until it ends.
    pub(super) keep: Option<Rc<dyn std::any::Any>>,
}

/// What the reading loop does next.
pub(super) enum Advance {
    Again,
    NeedInput,
    Stop,
    Act(Action),
}

/// One client connection.
pub(super) struct Connection<L: EventLoop + 'static, E: IoEngine + 'static> {
    pub(super) stream: Stream,
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
    pub(super) engine: AttachedEngine<L, E>,
    pub(super) serving: OnceCell<Serving<L, E>>,
    pub(super) st: RefCell<State>,
    pub(super) bh: OnceCell<BottomHalf>,
    /// Sends the replies queued, once per defer section (a batch of completions).
    pub(super) flush: OnceCell<DeferredCall>,
    pub(super) timer: Cell<Option<TimerId>>,
    /// The (read, write) interest registered with the context.
    pub(super) interest: Cell<(bool, bool)>,
}

/// What a connection serves once it has chosen an export.
pub(super) struct Serving<L: EventLoop + 'static, E: IoEngine + 'static> {
    pub(super) export: Arc<NbdExport>,
    pub(super) queue: ImageQueue<L, E>,
    pub(super) style: ReplyStyle,
    /// The metadata contexts negotiated for this export.
    pub(super) contexts: MetaContexts,
    /// Zeroing is fast here (see the module's header).
    pub(super) fast_zero: bool,
    pub(super) recorder: Recorder,
}

/// What the reading loop asks the connection to do with no state borrowed.
pub(super) enum Action {
    /// End the connection now.
    Close,
    /// Submit `request` for `slot`.
    Submit { slot: u16, request: BlockRequest },
    /// Ask the block layer for the status of `len` bytes at `offset`, for `slot`.
    Status { slot: u16, offset: u64, len: u64 },
}

/// What a request in flight is.
pub(super) enum Kind {
    /// A read whose buffer comes back to be sent.
    Read { buf: ReturnedBuf, len: usize },
    /// A write whose buffer the block layer holds (dropped at completion).
    Write { buf: Option<ReturnedBuf> },
    /// Block status.
    Status {
        req_one: bool,
        len: u64,
        /// Contexts still to answer.
        waiting: usize,
    },
    /// Anything without a buffer.
    Other,
}

/// One request in flight.
pub(super) struct InFlight {
    pub(super) to: Answering,
    pub(super) kind: Kind,
    pub(super) accounted: Option<Accounted>,
    /// Bytes of buffer it holds.
    pub(super) bytes: usize,
    /// A flush follows its success (FUA on a discard or write-zeroes).
    pub(super) then_flush: bool,
}

/// The requests in flight, by slot (a slot number is the request's index for its
/// statistics, below `max_in_flight`).
#[derive(Default)]
pub(super) struct Slots {
    pub(super) entries: Vec<Option<InFlight>>,
    pub(super) free: Vec<u16>,
    pub(super) busy: usize,
}

impl Slots {
    pub(super) fn insert(&mut self, f: InFlight) -> u16 {
        self.busy += 1;
        match self.free.pop() {
            Some(slot) => {
                self.entries[usize::from(slot)] = Some(f);
                slot
            }
            None => {
                self.entries.push(Some(f));
                (self.entries.len() - 1) as u16
            }
        }
    }

    pub(super) fn put_back(&mut self, slot: u16, f: InFlight) {
        if let Some(e) = self.entries.get_mut(usize::from(slot)) {
            if e.is_none() {
                self.busy += 1;
                self.free.retain(|&s| s != slot);
            }
            *e = Some(f);
        }
    }

    pub(super) fn get_mut(&mut self, slot: u16) -> Option<&mut InFlight> {
        self.entries.get_mut(usize::from(slot))?.as_mut()
    }

    /// Frees `slot`, whose request never ran (its payload never came): the bytes it held.
    pub(super) fn abandon(&mut self, slot: u16) -> usize {
        self.remove(slot).map_or(0, |f| f.bytes)
    }

    pub(super) fn remove(&mut self, slot: u16) -> Option<InFlight> {
        let f = self.entries.get_mut(usize::from(slot))?.take()?;
        self.busy -= 1;
        self.free.push(slot);
        Some(f)
    }

    /// Requests in flight.
    pub(super) fn busy(&self) -> usize {
        self.busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_keeps_a_busy_connections_buffers_and_trims_when_idle() {
        let mut pool = BufPool::default();
        let len = 256 << 10;
        // 64 requests of 256 KiB in flight (an `nbdcopy` connection), all given back.
        let bufs: Vec<_> = (0..64).map(|_| pool.take(len)).collect();
        let ids: Vec<_> = bufs.iter().map(|b| b.as_ptr()).collect();
        for b in bufs {
            pool.give(b);
        }
        assert_eq!(pool.bytes(), 64 * len, "all kept while busy");
        // The next round reuses every one of them.
        let again: Vec<_> = (0..64).map(|_| pool.take(len)).collect();
        assert!(again.iter().all(|b| ids.contains(&b.as_ptr())));
        for b in again {
            pool.give(b);
        }
        pool.trim_idle();
        assert_eq!(pool.bytes(), IDLE_POOL_BYTES);
        // Never past the busy bound.
        for _ in 0..(POOL_BYTES / len + 8) {
            pool.give(AlignedBuf::new(len));
        }
        assert!(pool.bytes() <= POOL_BYTES);
    }
}
