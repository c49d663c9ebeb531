//! A connection's requests: each checked one run on the block layer's request path (an
//! [`ImageQueue`] on the connection's context), and its reply queued when it completes, in
//! whatever order they complete.
//!
//! This module owns the requests in flight (their slots, buffers and statistics) and what
//! each command becomes for the block layer; the socket is `mod.rs`'s.
//!
//! * A read's buffer is lent to the block layer and taken back at completion to be sent; with
//!   structured replies, a read that found only zeros is sent as one hole chunk instead.
//! * A write's payload is received into its own buffer, then written from it.
//! * FUA on a discard or write-zeroes is a flush after it; on a write, the block layer's
//!   (`RWF_DSYNC` on raw, a flush after it on qcow2).
//! * `NBD_CMD_FLAG_FAST_ZERO` is refused (`ENOTSUP`) unless zeroing is a metadata operation
//!   here: a raw regular file (`fallocate`) or the null image.

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio_block::bitmap::DirtyBitmap;
use aio_block::stats::{Accounted, IoKind, Recorder};
use aio_block::status::ExtentKind;
use aio_block::{BlockRequest, Image, LentMemory, Reply};
use aio_core::engine::FileKind;
use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;

use super::state::{
    Action, Advance, Connection, InFlight, Kind, PendingWrite, Phase, Serving, State,
};
use crate::export::NbdExport;
use crate::meta::{bitmap_id, MetaContexts, ALLOCATION_DEPTH_ID, BASE_ALLOCATION_ID};
use crate::negotiate::ReplyStyle;
use crate::proto::{cmd, err, nbd_errno, state};
use crate::reply::{self, Answering};
use crate::request::{self, Checked, Command, Header};

/// The longest extent a 32-bit block status reply carries (whole 4 KiB blocks).
const MAX_EXTENT32: u64 = (u32::MAX as u64) & !4095;
/// The most extents one block status chunk carries: 1 MiB of them, as QEMU's
/// `NBD_MAX_BLOCK_STATUS_EXTENTS` (the reply may then cover less than asked).
const MAX_EXTENTS: usize = (1 << 20) / 8;

/// Whether `bytes` are all zero (16 at a time; stops at the first that is not).
fn all_zero(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(16);
    let wide = chunks
        .by_ref()
        .all(|c| u128::from_ne_bytes(c.try_into().unwrap_or([1; 16])) == 0);
    wide && chunks.remainder().iter().all(|&b| b == 0)
}

/// Whether write-zeroes on `image` is a metadata operation.
fn zeroes_fast(image: &Image) -> bool {
    match image.format_name() {
        "null" => true,
        "raw" => image.file().is_some_and(|f| f.kind() == FileKind::Regular),
        _ => false,
    }
}

/// The statistics kind of command `kind`, for a refused one.
fn io_kind(kind: u16) -> Option<IoKind> {
    match kind {
        cmd::READ => Some(IoKind::Read),
        cmd::WRITE | cmd::WRITE_ZEROES => Some(IoKind::Write),
        cmd::FLUSH => Some(IoKind::Flush),
        cmd::TRIM => Some(IoKind::Unmap),
        _ => None,
    }
}

/// Ranges `(offset, len, flags)` as block status descriptors of `[offset, offset + len)`:
/// clipped, merged where the flags agree, one only for `req_one`, none longer than 32 bits
/// allow unless `wide` (the reply may then cover less than asked, as the protocol allows).
pub(crate) fn descriptors(
    ranges: impl Iterator<Item = (u64, u64, u32)>,
    (offset, len): (u64, u64),
    req_one: bool,
    wide: bool,
) -> Vec<(u64, u32)> {
    let end = offset.saturating_add(len);
    let mut out: Vec<(u64, u32)> = Vec::new();
    for (at, n, flags) in ranges {
        let start = at.max(offset);
        let stop = at.saturating_add(n).min(end);
        if stop <= start {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == flags => last.0 += stop - start,
            _ => out.push((stop - start, flags)),
        }
    }
    if !wide {
        if let Some(i) = out.iter().position(|d| d.0 > MAX_EXTENT32) {
            out.truncate(i + 1);
            out[i].0 = MAX_EXTENT32;
        }
    }
    out.truncate(if req_one { 1 } else { MAX_EXTENTS });
    out
}

/// A dirty bitmap's ranges of `[offset, offset + len)` as block status ranges (dirty:
/// `NBD_STATE_DIRTY`); past the bitmap's end (a bitmap of a smaller node) everything is
/// clean.
fn bitmap_ranges(bitmap: &DirtyBitmap, offset: u64, len: u64) -> Vec<(u64, u64, u32)> {
    let mut out: Vec<(u64, u64, u32)> = bitmap
        .extents(offset, len)
        .into_iter()
        .map(|(at, n, dirty)| (at, n, if dirty { state::DIRTY } else { 0 }))
        .collect();
    let covered = out.last().map_or(offset, |&(at, n, _)| at + n);
    let end = offset.saturating_add(len);
    if covered < end {
        out.push((covered, end - covered, 0));
    }
    out
}

/// A request in flight, answering `to`.
fn in_flight(to: Answering, kind: Kind, bytes: usize, then_flush: bool) -> InFlight {
    InFlight {
        to,
        kind,
        accounted: None,
        bytes,
        then_flush,
    }
}

/// `request` in a new slot, for the reading loop to submit.
fn submit(st: &mut State, request: BlockRequest, mut f: InFlight) -> Advance {
    f.accounted = Some(Accounted::of(&request));
    let slot = st.slots.insert(f);
    Advance::Act(Action::Submit { slot, request })
}

/// A read of `len` bytes at `offset` into a buffer the block layer gives back at completion.
fn read(st: &mut State, to: Answering, offset: u64, len: usize) -> Advance {
    let (buffers, buf) = LentMemory::from_aligned(st.pool.take(len));
    st.buffered += len;
    let request = BlockRequest::Read { offset, buffers };
    submit(
        st,
        request,
        in_flight(to, Kind::Read { buf, len }, len, false),
    )
}

/// A write of `len` bytes at `offset`, its payload received next into a buffer of its own.
fn receive_write(st: &mut State, to: Answering, offset: u64, len: usize, fua: bool) -> Advance {
    let slot = st
        .slots
        .insert(in_flight(to, Kind::Write { buf: None }, len, false));
    st.buffered += len;
    st.pending_write = Some(PendingWrite {
        slot,
        buf: st.pool.take(len),
        filled: 0,
        offset,
        fua,
    });
    Advance::Again
}

/// `base:allocation`'s flags of an extent.
fn allocation_flags(kind: ExtentKind) -> u32 {
    match kind {
        ExtentKind::Data => 0,
        ExtentKind::Hole => state::HOLE | state::ZERO,
    }
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Connection<L, E> {
    /// The client chose `export`: transmission starts.
    pub(super) fn begin(&self, st: &mut State, export: Arc<NbdExport>) {
        let meta = st.negotiation.meta();
        let image = export.image();
        let serving = Serving {
            contexts: if meta.export == export.name() {
                meta.clone()
            } else {
                MetaContexts::for_export(&export)
            },
            style: st.negotiation.style(),
            fast_zero: zeroes_fast(image),
            recorder: Recorder::new(image.stats(), self.shared.limits.max_in_flight),
            queue: image.queue(self.engine.clone()),
            export,
        };
        self.shared.clients.chose(self.id, serving.export.name());
        let _ = self.serving.set(serving);
        st.phase = Phase::Transmit;
    }

    /// A request whose header was just read.
    pub(super) fn request(&self, st: &mut State, s: &Serving<L, E>, h: Header) -> Advance {
        let to = Answering {
            cookie: h.cookie,
            offset: h.offset,
        };
        let block_status = s.contexts.count() > 0;
        match request::check(&h, s.style, &s.export, block_status) {
            Checked::Refuse(r) => {
                if let Some(kind) = io_kind(h.kind) {
                    s.recorder.invalid(kind);
                }
                st.outbox
                    .put(|o| reply::error(o, s.style, to, r.errno, &r.message));
                st.skip = r.skip;
                if r.fatal {
                    st.ending = true;
                }
                Advance::Again
            }
            Checked::Run(command) => self.command(st, s, to, command),
        }
    }

    fn command(&self, st: &mut State, s: &Serving<L, E>, to: Answering, c: Command) -> Advance {
        let style = s.style;
        let in_flight = |kind, bytes, then_flush| in_flight(to, kind, bytes, then_flush);
        match c {
            Command::Disc => {
                st.ending = true;
                Advance::Stop
            }
            Command::Read { len: 0, .. }
            | Command::Write { len: 0, .. }
            | Command::Trim { len: 0, .. }
            | Command::WriteZeroes { len: 0, .. }
            | Command::Cache => {
                st.outbox.put(|o| reply::done(o, style, to));
                Advance::Again
            }
            Command::Read { offset, len } => read(st, to, offset, len as usize),
            Command::Write { offset, len, fua } => receive_write(st, to, offset, len as usize, fua),
            Command::Flush => submit(st, BlockRequest::Flush, in_flight(Kind::Other, 0, false)),
            Command::Trim { offset, len, fua } => {
                let request = BlockRequest::Discard { offset, len };
                submit(st, request, in_flight(Kind::Other, 0, fua))
            }
            Command::WriteZeroes { fast: true, .. } if !s.fast_zero => {
                let why = "zeroing this image would write its blocks";
                st.outbox
                    .put(|o| reply::error(o, style, to, err::ENOTSUP, why));
                Advance::Again
            }
            Command::WriteZeroes {
                offset,
                len,
                unmap,
                fua,
                ..
            } => {
                let request = BlockRequest::WriteZeroes { offset, len, unmap };
                submit(st, request, in_flight(Kind::Other, 0, fua))
            }
            Command::BlockStatus {
                offset,
                len,
                req_one,
            } => {
                let slot = st.slots.insert(in_flight(
                    Kind::Status {
                        req_one,
                        len,
                        waiting: 0,
                    },
                    0,
                    false,
                ));
                Advance::Act(Action::Status { slot, offset, len })
            }
        }
    }

    /// A write's payload is all in: it goes to the block layer.
    pub(super) fn write_received(&self, st: &mut State, w: PendingWrite) -> Advance {
        let (buffers, buf) = LentMemory::from_aligned(w.buf);
        let request = BlockRequest::Write {
            offset: w.offset,
            buffers,
            fua: w.fua,
        };
        if let Some(f) = st.slots.get_mut(w.slot) {
            f.accounted = Some(Accounted::of(&request));
            f.kind = Kind::Write { buf: Some(buf) };
        }
        Advance::Act(Action::Submit {
            slot: w.slot,
            request,
        })
    }

    pub(super) fn submit(self: &Rc<Self>, ctx: &AioContext<L>, slot: u16, request: BlockRequest) {
        if let Some(s) = self.serving.get() {
            s.recorder.taken(slot);
            s.queue.submit(ctx, self, request, slot);
        }
    }

    pub(super) fn block_status(
        self: &Rc<Self>,
        ctx: &AioContext<L>,
        slot: u16,
        offset: u64,
        len: u64,
    ) {
        let Some(s) = self.serving.get() else {
            return;
        };
        // One chunk per context negotiated, in whatever order they are answered (a bitmap's
        // at once, from memory); the last ends the reply.
        let (base, depth) = (s.contexts.base_allocation, s.contexts.allocation_depth);
        if let Some(Kind::Status { waiting, .. }) = self
            .st
            .borrow_mut()
            .slots
            .get_mut(slot)
            .map(|f| &mut f.kind)
        {
            *waiting = s.contexts.count();
        }
        if base {
            let me = self.weak();
            s.queue.block_status(ctx, offset, len, move |result| {
                if let Some(me) = me.upgrade() {
                    let ranges = result.map(|e| {
                        e.iter()
                            .map(|x| (x.offset, x.len, allocation_flags(x.kind)))
                            .collect()
                    });
                    me.status_done(slot, (offset, BASE_ALLOCATION_ID), ranges);
                }
            });
        }
        if depth {
            let me = self.weak();
            s.queue.allocation_depth(ctx, offset, len, move |result| {
                if let Some(me) = me.upgrade() {
                    let ranges =
                        result.map(|a| a.iter().map(|x| (x.offset, x.len, x.depth)).collect());
                    me.status_done(slot, (offset, ALLOCATION_DEPTH_ID), ranges);
                }
            });
        }
        for (i, bitmap) in s.export.dirty_bitmaps().iter().enumerate() {
            if s.contexts.bitmap(i) {
                let ranges = bitmap_ranges(bitmap, offset, len);
                self.status_done(slot, (offset, bitmap_id(i)), Ok(ranges));
            }
        }
    }

    /// One context's answer for the block status request in `slot`: its chunk, the reply's
    /// last once every context has answered.
    fn status_done(
        &self,
        slot: u16,
        (offset, id): (u64, u32),
        result: io::Result<Vec<(u64, u64, u32)>>,
    ) {
        let mut st = self.st.borrow_mut();
        let Some(f) = st.slots.get_mut(slot) else {
            return;
        };
        let Kind::Status {
            req_one,
            len,
            waiting,
        } = &mut f.kind
        else {
            return;
        };
        *waiting = waiting.saturating_sub(1);
        let (req_one, len, last, to) = (*req_one, *len, *waiting == 0, f.to);
        if last {
            st.slots.remove(slot);
        }
        let Some(s) = self.serving.get() else {
            return;
        };
        if st.phase == Phase::Closed {
            return;
        }
        let style = s.style;
        let wide = style == ReplyStyle::Extended;
        let list = result.map(|r| descriptors(r.into_iter(), (offset, len), req_one, wide));
        match list {
            Ok(list) if !list.is_empty() => st
                .outbox
                .put(|o| reply::block_status(o, style, to, (id, last), &list)),
            Ok(_) => {
                let why = (err::EIO, "the image reported no extents");
                st.outbox
                    .put(|o| reply::error_chunk(o, style, to, why, last))
            }
            Err(e) => {
                let why = e.to_string();
                let errno = nbd_errno(&e);
                st.outbox
                    .put(|o| reply::error_chunk(o, style, to, (errno, &why), last))
            }
        }
        self.completed(st);
    }

    /// After a reply is queued (`st` released first): the replies go out once per batch of
    /// completions, at the end of the loop's defer section (one `sendmsg` for a whole batch,
    /// as QEMU defers a virtqueue's interrupt), or at once outside one.
    fn completed(&self, st: std::cell::RefMut<'_, State>) {
        drop(st);
        match self.flush.get() {
            Some(flush) => flush.call(),
            None => self.flush_replies(),
        }
    }

    /// Sends the replies queued, and settles in the bottom half when the connection's
    /// interest or life may change.
    pub(super) fn flush_replies(&self) {
        let Ok(mut st) = self.st.try_borrow_mut() else {
            return;
        };
        // A full socket is written when it says it is writable, not at every batch of
        // completions (each such try would only hear `WouldBlock`).
        if !st.outbox.is_blocked() {
            self.send(&mut st);
        }
        let settle =
            st.stalled || st.ending || st.broken || st.write_blocked() || !st.resubmit.is_empty();
        drop(st);
        if settle {
            if let Some(bh) = self.bh.get() {
                bh.schedule();
            }
        }
    }
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Reply for Connection<L, E> {
    type Tag = u16;

    fn finish(&self, slot: u16, result: io::Result<()>) {
        let mut st = self.st.borrow_mut();
        let Some(f) = st.slots.remove(slot) else {
            return;
        };
        st.buffered -= f.bytes;
        let Some(s) = self.serving.get() else {
            return;
        };
        s.recorder.done(slot, f.accounted, result.is_ok());
        if st.phase == Phase::Closed {
            return;
        }
        let (style, to) = (s.style, f.to);
        // A write's buffer is kept for the next request (the block layer has let it go).
        let kind = match f.kind {
            Kind::Write { buf: Some(b) } => {
                if let Ok(buf) = b.take() {
                    st.pool.give(buf);
                }
                Kind::Other
            }
            kind => kind,
        };
        match (result, kind) {
            (Ok(()), _) if f.then_flush => {
                let flush = InFlight {
                    to,
                    kind: Kind::Other,
                    accounted: Some(Accounted::of(&BlockRequest::Flush)),
                    bytes: 0,
                    then_flush: false,
                };
                st.slots.put_back(slot, flush);
                st.resubmit.push(slot);
            }
            (Ok(()), Kind::Read { buf, len }) => match buf.take() {
                // Zeros go as a hole: 20 bytes on the wire instead of `len`.
                Ok(buf) if style != ReplyStyle::Simple && all_zero(&buf[..len]) => {
                    let hole = len as u32;
                    st.outbox
                        .put(|o| reply::read_hole(o, style, to, to.offset, hole));
                    st.pool.give(buf);
                }
                Ok(buf) => {
                    st.outbox
                        .put(|o| reply::read_data(o, style, to, to.offset, len as u64));
                    st.outbox.data(buf, len);
                }
                Err(_) => st.outbox.put(|o| {
                    reply::error(o, style, to, err::EIO, "the read's buffer is still held")
                }),
            },
            (Ok(()), _) => st.outbox.put(|o| reply::done(o, style, to)),
            (Err(e), _) => st
                .outbox
                .put(|o| reply::error(o, style, to, nbd_errno(&e), &e.to_string())),
        }
        self.completed(st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio_block::status::Extent;

    /// `extents` as the ranges `descriptors` takes.
    fn ranges(extents: &[Extent]) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        extents
            .iter()
            .map(|x| (x.offset, x.len, allocation_flags(x.kind)))
    }

    fn extent(offset: u64, len: u64, kind: ExtentKind) -> Extent {
        Extent { offset, len, kind }
    }

    #[test]
    fn extents_are_clipped_merged_cut_to_one_and_to_32_bits() {
        let (d, h) = (ExtentKind::Data, ExtentKind::Hole);
        let e = [
            extent(0, 4096, d),
            extent(4096, 4096, d),
            extent(8192, 8192, h),
            extent(16384, 4096, d),
        ];
        let hole = state::HOLE | state::ZERO;
        assert_eq!(
            descriptors(ranges(&e), (1024, 12288), false, false),
            [(7168, 0), (5120, hole)]
        );
        assert_eq!(
            descriptors(ranges(&e), (0, 20480), true, false),
            [(8192, 0)]
        );
        let big = [extent(0, 8 << 30, h)];
        assert_eq!(
            descriptors(ranges(&big), (0, 8 << 30), false, false),
            [(MAX_EXTENT32, hole)]
        );
        assert_eq!(
            descriptors(ranges(&big), (0, 8 << 30), false, true),
            [(8 << 30, hole)]
        );
        assert!(descriptors(ranges(&e), (1 << 20, 4096), false, false).is_empty());
    }
}
