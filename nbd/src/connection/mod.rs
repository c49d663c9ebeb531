//! One client on the context that serves it: its socket an fd handler, its handshake, then
//! its requests on the block layer and its replies as they complete.
//!
//! This module owns a connection's life and its socket I/O: reading (options, request
//! headers, write payloads straight into their buffers), pausing when a limit is reached,
//! and ending (the handshake's deadline, `NBD_CMD_DISC`, the client gone, the server
//! stopping it). Running a request and building its reply is `transmit.rs`'s; the bytes are
//! `negotiate.rs`'s, `request.rs`'s and `reply.rs`'s.
//!
//! * **A connection owns itself until it ends**: the fd handler, bottom half and timer hold
//!   weak references; ending drops the strong one. Requests in flight keep it alive until
//!   they complete, and their buffers belong to the block layer's holds until then.
//! * **Bounded**: past `max_in_flight` requests or `max_held_bytes` of buffers and unsent
//!   replies it stops reading the socket, and starts again as they go.
//! * **Ending drains**: after `NBD_CMD_DISC` or the client's end of the socket, requests in
//!   flight finish and their replies are sent before the socket closes.

mod outbox;
mod state;
mod tls;
mod transmit;

use std::cell::{Cell, OnceCell, RefCell};
use std::io;
use std::rc::{Rc, Weak};

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AttachedEngine;
use aio_loop::{AioContext, FdHandler};

use crate::negotiate::{self, Negotiation, Step};
use crate::request;
use crate::server::Accepted;
use outbox::Outbox;
use state::{Action, Advance, Connection, Inbox, Phase, Slots, State, INBOX};

/// Requests taken per readiness before other handlers get a turn.
const BATCH: usize = 128;

/// Serves an accepted client on `ctx`, whose requests run on `engine` (attached to `ctx`).
/// Returns once the socket is watched; the connection then lives on `ctx` until it ends.
pub fn serve<L: EventLoop + 'static, E: IoEngine + 'static>(
    ctx: &AioContext<L>,
    engine: AttachedEngine<L, E>,
    accepted: Accepted,
) -> io::Result<()> {
    let (stream, shared, id) = accepted.take();
    let tls_required = shared.tls.is_some();
    let conn = Rc::new(Connection {
        stream,
        shared,
        id,
        engine,
        serving: OnceCell::new(),
        st: RefCell::new(State {
            phase: Phase::ClientFlags,
            inbox: Inbox::new(),
            negotiation: Negotiation::new(tls_required),
            outbox: Outbox::default(),
            slots: Slots::default(),
            buffered: 0,
            pending_write: None,
            skip: 0,
            ending: false,
            broken: false,
            stalled: false,
            resume: false,
            tls_pending: false,
            tls: None,
            pool: state::BufPool::default(),
            resubmit: Vec::new(),
            keep: None,
        }),
        bh: OnceCell::new(),
        flush: OnceCell::new(),
        timer: Cell::new(None),
        interest: Cell::new((false, false)),
    });
    conn.start(ctx)
        .inspect_err(|_| conn.shared.clients.leave(conn.id))
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Connection<L, E> {
    fn start(self: &Rc<Self>, ctx: &AioContext<L>) -> io::Result<()> {
        let weak = Rc::downgrade(self);
        let _ = self.bh.set(ctx.bh_new(move |ctx| {
            if let Some(me) = weak.upgrade() {
                me.on_bottom_half(ctx);
            }
        }));
        let weak = Rc::downgrade(self);
        let _ = self.flush.set(ctx.deferred_call(move || {
            if let Some(me) = weak.upgrade() {
                me.flush_replies();
            }
        }));
        let weak = Rc::downgrade(self);
        let timer = ctx.timer_new(move |ctx| {
            if let Some(me) = weak.upgrade() {
                if me.serving.get().is_none() {
                    me.close(ctx);
                }
            }
        });
        ctx.timer_mod_in(timer, self.shared.limits.handshake_timeout)
            .map_err(io::Error::from)?;
        self.timer.set(Some(timer));
        {
            let mut st = self.st.borrow_mut();
            st.keep = Some(self.clone());
            st.outbox
                .put(|o| o.extend_from_slice(&negotiate::greeting()));
            self.send(&mut st);
        }
        self.settle(ctx);
        Ok(())
    }

    fn weak(self: &Rc<Self>) -> Weak<Self> {
        Rc::downgrade(self)
    }

    /// Sends what the socket takes (through TLS once it runs); a failed send ends the
    /// connection.
    fn send(&self, st: &mut State) {
        let stream = &self.stream;
        let sent = match st.tls.as_mut() {
            Some(tls) => st
                .outbox
                .send(&mut |bufs| tls.send(stream, bufs))
                .and_then(|()| tls.flush(stream)),
            None => st.outbox.send(&mut |bufs| stream.send(bufs)),
        };
        if sent.is_err() {
            st.broken = true;
            st.outbox.clear();
        }
        let State {
            outbox,
            pool,
            slots,
            ..
        } = st;
        for buf in outbox.take_spent() {
            pool.give(buf);
        }
        if slots.busy() == 0 && outbox.is_empty() {
            pool.trim_idle();
        }
    }

    fn paused(&self, st: &State) -> bool {
        let limits = &self.shared.limits;
        st.slots.busy() >= usize::from(limits.max_in_flight)
            || st.buffered + st.outbox.bytes() >= limits.max_held_bytes
    }

    /// The socket is readable (or input is waiting after a pause).
    fn on_readable(self: &Rc<Self>, ctx: &AioContext<L>) {
        // Requests that complete while they are taken (a refusal, the null image) have
        // their replies sent together at the end.
        let _batch = ctx.defer_section();
        let plugged = self.serving.get().inspect(|s| s.queue.plug()).is_some();
        let mut taken = 0;
        // A read that filled less than it was offered emptied the socket: the next one would
        // only say `EAGAIN` (the fd is level-triggered: more input is reported by the next
        // wait). Not so under TLS, whose session may hold plaintext the socket no longer has.
        let mut drained = false;
        loop {
            let next = {
                let mut st = self.st.borrow_mut();
                if taken >= BATCH {
                    st.stalled = true;
                    Advance::Stop
                } else {
                    self.advance(&mut st)
                }
            };
            match next {
                Advance::Again => {}
                Advance::Act(a) => {
                    taken += 1;
                    self.act(ctx, a);
                }
                Advance::Stop => break,
                Advance::NeedInput if drained => break,
                Advance::NeedInput => match self.fill() {
                    Ok(Some(short)) => drained = short,
                    Ok(None) | Err(()) => break,
                },
            }
        }
        if let Some(s) = self.serving.get() {
            if plugged {
                s.queue.unplug(ctx);
            }
            s.recorder.batch_end();
        }
        let mut st = self.st.borrow_mut();
        self.send(&mut st);
        drop(st);
        self.settle(ctx);
    }

    /// Reads into the pending write's buffer or the inbox: `Ok(Some(short))` when bytes came
    /// (`short`: fewer than offered, from the socket itself), `Ok(None)` when none are there;
    /// Err when the socket ended (`ending` set).
    fn fill(&self) -> Result<Option<bool>, ()> {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let (stream, tls) = (&self.stream, &mut st.tls);
        let mut from_client = |dest: &mut [u8]| match tls.as_mut() {
            Some(t) => t.read(stream, dest),
            None => stream.read(dest),
        };
        let mut offered = 0;
        let read = match st.pending_write.as_mut() {
            Some(w) if st.inbox.bytes().is_empty() => {
                offered = w.buf.len() - w.filled;
                let r = from_client(&mut w.buf[w.filled..]);
                if let Ok(n) = r {
                    w.filled += n;
                }
                r
            }
            _ => st.inbox.fill(|dest| {
                offered = dest.len();
                from_client(dest)
            }),
        };
        let plain = st.tls.is_none();
        match read {
            Ok(0) => {
                st.ending = true;
                Err(())
            }
            Ok(n) => Ok(Some(plain && n < offered)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(false)),
            Err(_) => {
                st.ending = true;
                st.broken = true;
                Err(())
            }
        }
    }

    /// The next thing the input allows.
    fn advance(&self, st: &mut State) -> Advance {
        if st.ending || st.broken || st.tls_pending {
            return Advance::Stop;
        }
        let have = st.inbox.bytes().len();
        match st.phase {
            Phase::ClientFlags => {
                let Some(b) = st.inbox.bytes().get(..4) else {
                    return Advance::NeedInput;
                };
                let flags = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                st.inbox.consume(4);
                match st.negotiation.client_flags(flags) {
                    Ok(()) => st.phase = Phase::OptionHeader,
                    Err(e) => return self.refuse_session(st, &e),
                }
                Advance::Again
            }
            Phase::OptionHeader => {
                let Some(b) = st.inbox.bytes().get(..16) else {
                    return Advance::NeedInput;
                };
                let header: [u8; 16] = b.try_into().unwrap_or([0; 16]);
                st.inbox.consume(16);
                match negotiate::option_header(&header) {
                    Ok((option, len)) if len as usize > INBOX => {
                        st.phase = Phase::SkipOption {
                            option,
                            left: u64::from(len),
                        };
                    }
                    Ok((option, len)) => {
                        st.phase = Phase::OptionPayload {
                            option,
                            len: len as usize,
                        }
                    }
                    Err(e) => return self.refuse_session(st, &e),
                }
                Advance::Again
            }
            Phase::OptionPayload { option, len } => {
                if have < len {
                    return Advance::NeedInput;
                }
                self.option(st, option, len)
            }
            Phase::SkipOption { option, left } => {
                let n = (have as u64).min(left);
                st.inbox.consume(n as usize);
                if n < left {
                    st.phase = Phase::SkipOption {
                        option,
                        left: left - n,
                    };
                    return Advance::NeedInput;
                }
                let mut out = Vec::new();
                let step = st.negotiation.oversized(option, &mut out);
                st.outbox.put(|o| o.extend_from_slice(&out));
                st.phase = Phase::OptionHeader;
                self.after_option(st, step)
            }
            Phase::Transmit => self.next_request(st),
            Phase::Closed => Advance::Stop,
        }
    }

    /// Answers the option whose `len`-byte payload is at the inbox's front.
    fn option(&self, st: &mut State, option: u32, len: usize) -> Advance {
        let mut out = Vec::new();
        let State {
            inbox, negotiation, ..
        } = st;
        let step = negotiation.option(
            option,
            &inbox.bytes()[..len],
            &self.shared.exports,
            &mut out,
        );
        st.inbox.consume(len);
        st.outbox.put(|o| o.extend_from_slice(&out));
        st.phase = Phase::OptionHeader;
        self.after_option(st, step)
    }

    fn after_option(&self, st: &mut State, step: Step) -> Advance {
        match step {
            Step::Next => Advance::Again,
            Step::Transmit(export) => {
                self.begin(st, export);
                Advance::Again
            }
            Step::Abort => {
                st.ending = true;
                Advance::Stop
            }
            // The acknowledgement goes out in the clear; TLS starts once it has (`settle`).
            Step::StartTls if self.shared.tls.is_some() => {
                st.tls_pending = true;
                Advance::Stop
            }
            Step::StartTls => Advance::Act(Action::Close),
            Step::Close(e) => self.refuse_session(st, &e),
        }
    }

    /// A protocol error that ends the session at once.
    fn refuse_session(&self, st: &mut State, _why: &dyn std::error::Error) -> Advance {
        st.ending = true;
        Advance::Act(Action::Close)
    }

    /// The next request, once its header (and a write's payload) is in.
    fn next_request(&self, st: &mut State) -> Advance {
        if let Some(mut w) = st.pending_write.take() {
            let want = w.buf.len() - w.filled;
            let n = want.min(st.inbox.bytes().len());
            w.buf[w.filled..w.filled + n].copy_from_slice(&st.inbox.bytes()[..n]);
            st.inbox.consume(n);
            w.filled += n;
            if w.filled < w.buf.len() {
                st.pending_write = Some(w);
                return Advance::NeedInput;
            }
            return self.write_received(st, w);
        }
        if st.skip > 0 {
            let n = (st.inbox.bytes().len() as u64).min(st.skip);
            st.inbox.consume(n as usize);
            st.skip -= n;
            return if st.skip > 0 {
                Advance::NeedInput
            } else {
                Advance::Again
            };
        }
        if self.paused(st) {
            st.stalled = true;
            return Advance::Stop;
        }
        let Some(serving) = self.serving.get() else {
            return Advance::Stop;
        };
        let need = request::header_len(serving.style);
        let Some(bytes) = st.inbox.bytes().get(..need) else {
            return Advance::NeedInput;
        };
        let header = match request::parse_header(bytes, serving.style) {
            Ok(h) => h,
            Err(e) => return self.refuse_session(st, &e),
        };
        st.inbox.consume(need);
        self.request(st, serving, header)
    }

    /// Runs `a` (no state borrowed: a request may complete inside its submission).
    fn act(self: &Rc<Self>, ctx: &AioContext<L>, a: Action) {
        match a {
            Action::Close => self.close(ctx),
            Action::Submit { slot, request } => self.submit(ctx, slot, request),
            Action::Status { slot, offset, len } => self.block_status(ctx, slot, offset, len),
        }
    }

    /// After reading, writing or completions: resubmits FUA flushes, sets the interest,
    /// and closes a connection that has ended and drained.
    fn settle(self: &Rc<Self>, ctx: &AioContext<L>) {
        let flushes = std::mem::take(&mut self.st.borrow_mut().resubmit);
        for slot in flushes {
            self.submit(ctx, slot, aio_block::BlockRequest::Flush);
        }
        if self.serving.get().is_some() {
            if let Some(t) = self.timer.take() {
                let _ = ctx.timer_free(t);
            }
        }
        let mut st = self.st.borrow_mut();
        if st.phase == Phase::Closed {
            return;
        }
        if st.ending {
            // A write whose payload will never all come is dropped unanswered.
            if let Some(w) = st.pending_write.take() {
                let freed = st.slots.abandon(w.slot);
                st.buffered -= freed;
            }
        }
        let drained = st.slots.busy() == 0 && st.outbox.is_empty() && st.pending_write.is_none();
        if st.broken || (st.ending && drained) {
            drop(st);
            return self.close(ctx);
        }
        if st.tls_pending && st.outbox.is_empty() {
            // The acknowledgement is out: the bytes after it are the client's TLS handshake.
            let Some(creds) = self.shared.tls.as_ref() else {
                drop(st);
                return self.close(ctx);
            };
            match tls::TlsSession::start(creds.config(), st.inbox.bytes()) {
                Ok(session) => st.tls = Some(session),
                Err(_) => {
                    drop(st);
                    return self.close(ctx);
                }
            }
            let early = st.inbox.bytes().len();
            st.inbox.consume(early);
            st.negotiation.tls_started();
            st.tls_pending = false;
            st.resume = true;
            self.send(&mut st);
        }
        let read = !st.ending && !st.tls_pending && !self.paused(&st);
        let write = st.write_blocked();
        // Input may be waiting where no readiness will tell of it (in the inbox, or in the
        // TLS session): the bottom half reads again.
        if read && std::mem::take(&mut st.stalled) {
            st.resume = true;
        }
        let resume = read && st.resume;
        drop(st);
        self.set_interest(ctx, read, write);
        if resume {
            if let Some(bh) = self.bh.get() {
                bh.schedule();
            }
        }
    }

    fn on_bottom_half(self: &Rc<Self>, ctx: &AioContext<L>) {
        let resume = {
            let mut st = self.st.borrow_mut();
            let resume = std::mem::take(&mut st.resume);
            resume && !st.ending && st.phase != Phase::Closed && !self.paused(&st)
        };
        if resume {
            self.on_readable(ctx);
        } else {
            self.settle(ctx);
        }
    }

    fn on_writable(self: &Rc<Self>, ctx: &AioContext<L>) {
        let mut st = self.st.borrow_mut();
        self.send(&mut st);
        drop(st);
        self.settle(ctx);
    }

    /// Watches the socket for `read` and `write` readiness (neither: not at all).
    fn set_interest(self: &Rc<Self>, ctx: &AioContext<L>, read: bool, write: bool) {
        let before = self.interest.get();
        if before == (read, write) {
            return;
        }
        self.interest.set((read, write));
        if !read && !write {
            let _ = ctx.remove_fd_handler(&self.stream);
            return;
        }
        let mut handler = FdHandler::new();
        if read {
            let me = self.weak();
            handler = handler.on_read(move |ctx| {
                if let Some(me) = me.upgrade() {
                    me.on_readable(ctx);
                }
            });
        }
        if write {
            let me = self.weak();
            handler = handler.on_write(move |ctx| {
                if let Some(me) = me.upgrade() {
                    me.on_writable(ctx);
                }
            });
        }
        let set = if before == (false, false) {
            ctx.set_fd_handler(&self.stream, handler)
        } else {
            ctx.update_fd_handler(&self.stream, handler)
        };
        if set.is_err() {
            self.st.borrow_mut().broken = true;
        }
    }

    /// Ends the connection now: the socket shut down and unwatched, the client gone from the
    /// server's list. Requests still in flight complete into nothing.
    fn close(self: &Rc<Self>, ctx: &AioContext<L>) {
        let keep = {
            let mut st = self.st.borrow_mut();
            if st.phase == Phase::Closed {
                return;
            }
            st.phase = Phase::Closed;
            st.ending = true;
            st.outbox.clear();
            st.pending_write = None;
            st.keep.take()
        };
        if self.interest.replace((false, false)) != (false, false) {
            let _ = ctx.remove_fd_handler(&self.stream);
        }
        if let Some(t) = self.timer.take() {
            let _ = ctx.timer_free(t);
        }
        if let Some(bh) = self.bh.get() {
            bh.delete();
        }
        self.stream.shutdown();
        self.shared.clients.leave(self.id);
        drop(keep);
    }
}
