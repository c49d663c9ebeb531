//! The fd handlers' table: the callbacks of each fd as the loop keeps them, and the table
//! that maps monitor tokens back to them.
//!
//! This module owns the handler table's bookkeeping (tokens with generations, the fd index, the
//! last dispatch of each direction) and each handler's polling-mode state (`io_poll_begin`
//! and `io_poll_end` run once each). It never calls the monitor or a loop callback itself; the
//! context does both, after releasing every borrow of the table, so callbacks may change the
//! table. Generic over the callbacks' argument `C` (the context), it never names the context:
//! the user's side, [`FdHandler`](crate::FdHandler), and the context's calls that install it
//! are `handlers.rs`'s.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::rc::Rc;

use super::callback::{LoopCallback, PollCheck, PollHook};
use aio_core::kit::{SlotId, Slots};
use aio_core::{Interest, Token};

/// The callbacks of one fd as the table keeps them: what an [`FdHandler`](crate::FdHandler)
/// was built with.
pub(crate) struct HandlerCallbacks<C> {
    pub(crate) io_read: Option<LoopCallback<C>>,
    pub(crate) io_write: Option<LoopCallback<C>>,
    pub(crate) io_poll: Option<PollCheck>,
    pub(crate) io_poll_ready: Option<LoopCallback<C>>,
    pub(crate) io_poll_begin: Option<PollHook>,
    pub(crate) io_poll_end: Option<PollHook>,
    /// `io_poll_begin` ran and `io_poll_end` has not yet.
    pub(crate) poll_begun: Cell<bool>,
}

impl<C> HandlerCallbacks<C> {
    /// No callbacks yet.
    pub(crate) fn new() -> Self {
        HandlerCallbacks {
            io_read: None,
            io_write: None,
            io_poll: None,
            io_poll_ready: None,
            io_poll_begin: None,
            io_poll_end: None,
            poll_begun: Cell::new(false),
        }
    }

    /// Whether polling mode concerns this handler (an `io_poll` check and a hook).
    pub(crate) fn has_poll_hooks(&self) -> bool {
        self.io_poll.is_some() && (self.io_poll_begin.is_some() || self.io_poll_end.is_some())
    }

    /// What the monitor must watch the fd for.
    pub(crate) fn interest(&self) -> Interest {
        // A handler that only polls still needs its fd watched, so that it is woken when it
        // has left the poll set (idle) or polling is off; its readiness then runs
        // io_poll_ready.
        let mut interest = Interest::NONE;
        if self.io_read.is_some() || self.io_poll.is_some() {
            interest |= Interest::READABLE;
        }
        if self.io_write.is_some() {
            interest |= Interest::WRITABLE;
        }
        interest
    }

    /// Begins polling mode for this handler (once).
    pub(crate) fn begin_polling(&self) {
        if !self.poll_begun.replace(true) {
            run_hook(&self.io_poll_begin);
        }
    }

    /// Ends polling mode for this handler if it began; with `check`, runs `io_poll` once more
    /// afterwards and says whether it found work.
    pub(crate) fn end_polling(&self, check: bool) -> bool {
        if !self.poll_begun.replace(false) {
            return false;
        }
        run_hook(&self.io_poll_end);
        check
            && self
                .io_poll
                .as_ref()
                .is_some_and(|p| p.try_borrow_mut().is_ok_and(|mut f| f()))
    }
}

/// Runs a hook unless it is running already (a hook must not reach the context, but a panic
/// guard is cheaper than a rule).
fn run_hook(hook: &Option<PollHook>) {
    if let Some(Ok(mut f)) = hook.as_ref().map(|h| h.try_borrow_mut()) {
        f();
    }
}

/// One installed handler.
pub(crate) struct HandlerSlot<C> {
    pub(crate) fd: RawFd,
    pub(crate) callbacks: Rc<HandlerCallbacks<C>>,
    /// The fd was reported closed (`POLLNVAL`); it is no longer watched.
    pub(crate) closed: bool,
    /// The last wait whose report ran the read side (`io_read` / `io_poll_ready`).
    pub(crate) last_read_dispatch: u64,
    /// The last wait whose report ran `io_write`.
    pub(crate) last_write_dispatch: u64,
}

/// Slots addressed by token: the low 32 bits index, the high 32 bits a generation, so that an
/// event or poll-set entry of a removed handler can never reach a new handler in the same slot.
pub(crate) struct HandlerTable<C> {
    slots: Slots<HandlerSlot<C>>,
    by_fd: HashMap<RawFd, Token>,
    /// Handlers with an `io_write` callback.
    writers: usize,
    /// Handlers with polling-mode hooks ([`HandlerCallbacks::has_poll_hooks`]).
    hooked: usize,
}

impl<C> HandlerTable<C> {
    pub(crate) fn new() -> Self {
        HandlerTable {
            slots: Slots::new(),
            by_fd: HashMap::new(),
            writers: 0,
            hooked: 0,
        }
    }

    pub(crate) fn token_of(&self, fd: RawFd) -> Option<Token> {
        self.by_fd.get(&fd).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_fd.len()
    }

    /// Whether some handler waits for writability (which only the monitor reports).
    pub(crate) fn has_writers(&self) -> bool {
        self.writers > 0
    }

    pub(crate) fn get(&self, token: Token) -> Option<&HandlerSlot<C>> {
        self.slots.get(SlotId::from_u64(token.0))
    }

    pub(crate) fn get_mut(&mut self, token: Token) -> Option<&mut HandlerSlot<C>> {
        self.slots.get_mut(SlotId::from_u64(token.0))
    }

    /// The token the next [`HandlerTable::insert`] gives (the monitor learns it first).
    pub(crate) fn next_token(&self) -> Token {
        Token(self.slots.next_id().to_u64())
    }

    pub(crate) fn insert(&mut self, fd: RawFd, callbacks: Rc<HandlerCallbacks<C>>) -> Token {
        self.writers += usize::from(callbacks.io_write.is_some());
        self.hooked += usize::from(callbacks.has_poll_hooks());
        let token = Token(
            self.slots
                .insert(HandlerSlot {
                    fd,
                    callbacks,
                    closed: false,
                    last_read_dispatch: 0,
                    last_write_dispatch: 0,
                })
                .to_u64(),
        );
        self.by_fd.insert(fd, token);
        token
    }

    /// Replaces the callbacks of a live handler, keeping its token; returns the old ones so
    /// that the caller drops them after releasing the table.
    pub(crate) fn replace(
        &mut self,
        token: Token,
        callbacks: Rc<HandlerCallbacks<C>>,
    ) -> Option<Rc<HandlerCallbacks<C>>> {
        let slot = self.get_mut(token)?;
        let was_writer = slot.callbacks.io_write.is_some();
        let is_writer = callbacks.io_write.is_some();
        let (was_hooked, is_hooked) = (slot.callbacks.has_poll_hooks(), callbacks.has_poll_hooks());
        let old = std::mem::replace(&mut slot.callbacks, callbacks);
        self.writers = self.writers + usize::from(is_writer) - usize::from(was_writer);
        self.hooked = self.hooked + usize::from(is_hooked) - usize::from(was_hooked);
        Some(old)
    }

    pub(crate) fn remove(&mut self, token: Token) -> Option<HandlerSlot<C>> {
        let slot = self.slots.remove(SlotId::from_u64(token.0))?;
        self.writers -= usize::from(slot.callbacks.io_write.is_some());
        self.hooked -= usize::from(slot.callbacks.has_poll_hooks());
        self.by_fd.remove(&slot.fd);
        Some(slot)
    }

    /// How many handlers have polling-mode hooks.
    pub(crate) fn hooked_count(&self) -> usize {
        self.hooked
    }

    /// Whether the handler is live, not closed, and has an `io_poll` check (busy polling may
    /// check it).
    pub(crate) fn is_pollable(&self, token: Token) -> bool {
        self.get(token)
            .is_some_and(|slot| !slot.closed && slot.callbacks.io_poll.is_some())
    }

    /// Marks a handler's fd as closed: it is no longer watched (the caller takes it out of the
    /// poll set).
    pub(crate) fn mark_closed(&mut self, token: Token) -> Option<RawFd> {
        let slot = self.get_mut(token)?;
        if slot.closed {
            return None;
        }
        slot.closed = true;
        Some(slot.fd)
    }
}
