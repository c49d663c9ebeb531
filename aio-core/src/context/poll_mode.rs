//! Polling mode, QEMU's `poll_set_started()`: the `io_poll_begin` / `io_poll_end` hooks of fd
//! handlers, run when the loop starts and stops busy-polling them (the rules are on
//! [`FdHandler::on_poll_begin`]).
//!
//! This module owns when the hooks run and the last `io_poll` check after `io_poll_end`,
//! never the busy polling itself (`iteration.rs`) or the handler table (`handlers.rs`).

use std::rc::Rc;

use super::handlers::{FdHandler, PollHook};
use super::AioContext;
use crate::event_loop::{EventLoop, Token};

/// Runs a hook unless it is running already (a hook must not reach the context, but a panic
/// guard is cheaper than a rule).
fn run_hook(hook: &Option<PollHook>) {
    if let Some(Ok(mut f)) = hook.as_ref().map(|h| h.try_borrow_mut()) {
        f();
    }
}

impl<L: EventLoop> FdHandler<L> {
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

impl<L: EventLoop> AioContext<L> {
    /// Begins polling mode for the poll set's hooked handlers (`started`), ending it for those
    /// that left the set; or ends it for all (`!started`). Tokens whose last check after
    /// `io_poll_end` found work go to `ready`; returns whether there were any.
    pub(super) fn poll_set_started(&self, started: bool, ready: &mut Vec<Token>) -> bool {
        // Every handler in polling mode began in a `started` call since the last end: without
        // one, ending has nothing to do (the common iteration: no table scan, no allocation).
        if !started && !self.poll_started.get() {
            return false;
        }
        self.poll_started.set(started);
        let hooked: Vec<(Token, bool, Rc<FdHandler<L>>)> = self.handlers.borrow().hooked_handlers();
        let mut found = false;
        for (token, in_poll_set, handler) in hooked {
            if started && in_poll_set {
                handler.begin_polling();
            } else if handler.end_polling(true) {
                ready.push(token);
                found = true;
            }
        }
        found
    }
}
