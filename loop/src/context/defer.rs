//! Deferred calls, QEMU's `defer_call()` (formerly `blk_io_plug`): work a callback asks for
//! that runs once, at the end of the batch the callback runs in. A virtual disk raises a
//! queue's interrupt once after a whole batch of completions is on its used ring, instead of
//! once per completion (an eventfd write each, and a guest woken before the rest of the batch
//! is there).
//!
//! This module owns defer sections and the calls pending in them, never the batches: the
//! engine driver opens a section around each delivery of completions, and callers open their
//! own with [`AioContext::defer_section`](super::AioContext::defer_section).
//!
//! * [`AioContext::deferred_call`](super::AioContext::deferred_call) makes a [`DeferredCall`]
//!   from a closure. [`DeferredCall::call`] runs it at once outside a section; inside one it
//!   runs once, when the outermost section ends, however often it was called (QEMU
//!   deduplicates by function and argument, here by handle).
//! * Sections nest. The pending calls run when the outermost one ends, in the order they were
//!   first called; a call made while they run joins the same pass.
//! * The engine driver wraps each delivery of completions (the callbacks, the tasks they woke,
//!   and the submission of the requests they queued) in a section, as QEMU's Linux AIO and
//!   io_uring completion handlers do. A nested `poll()` inside that delivery does not run the
//!   outer section's calls: a nested loop must not wait for something only a deferred call
//!   would do.
//! * Loop-thread objects: [`DeferredCall`] and [`DeferSection`] are `!Send`.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

/// A context's defer sections: their depth and the calls pending until the outermost ends.
#[derive(Default)]
pub(crate) struct DeferState {
    depth: Cell<u32>,
    pending: RefCell<Vec<Rc<Call>>>,
}

/// One deferred call's closure and whether it is pending.
struct Call {
    pending: Cell<bool>,
    f: RefCell<Box<dyn FnMut()>>,
}

impl Call {
    fn run(&self) {
        // A closure that calls its own handle while it runs queues another run (inside a
        // section) or, outside, finds the closure busy and is dropped: never re-entered.
        if let Ok(mut f) = self.f.try_borrow_mut() {
            f();
        }
    }
}

impl DeferState {
    pub(crate) fn begin(self: &Rc<Self>) -> DeferSection {
        self.depth.set(self.depth.get() + 1);
        DeferSection {
            state: self.clone(),
        }
    }

    /// Ends a section; at the outermost, runs the pending calls (still inside a section, so
    /// that calls made meanwhile join this pass; closed again even if a call panics).
    fn end(&self) {
        if self.depth.get() > 1 {
            self.depth.set(self.depth.get() - 1);
            return;
        }
        struct Close<'a>(&'a Cell<u32>);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                self.0.set(0);
            }
        }
        let _close = Close(&self.depth);
        loop {
            let next = {
                let mut pending = self.pending.borrow_mut();
                if pending.is_empty() {
                    break;
                }
                pending.remove(0)
            };
            next.pending.set(false);
            next.run();
        }
    }

    fn call(&self, call: &Rc<Call>) {
        if self.depth.get() == 0 {
            call.run();
        } else if !call.pending.replace(true) {
            self.pending.borrow_mut().push(call.clone());
        }
    }

    pub(crate) fn new_call(self: &Rc<Self>, f: Box<dyn FnMut()>) -> DeferredCall {
        DeferredCall {
            state: self.clone(),
            call: Rc::new(Call {
                pending: Cell::new(false),
                f: RefCell::new(f),
            }),
        }
    }
}

/// A call that runs at once outside a defer section and once at the end of the outermost
/// section inside one (QEMU's `defer_call()`). Made by
/// [`AioContext::deferred_call`](super::AioContext::deferred_call); clones share the call.
///
/// * [`DeferredCall::call`] outside a section runs the closure at once; inside one it marks
///   it, and it runs once when the outermost section ends, however often it was called.
/// * Sections ([`AioContext::defer_section`](super::AioContext::defer_section)) nest. The
///   pending calls run when the outermost one ends, in the order they were first called; a
///   call made while they run joins the same pass. A call that panics still closes the
///   section.
/// * Every delivery of an engine's completions to its callbacks is a section: the callbacks,
///   the tasks they woke, and the submission of the requests they queued come first, then
///   the calls they deferred (a virtqueue's interrupt). A nested `poll()` inside that
///   delivery does not run the outer section's calls: a nested loop must not wait for
///   something only a deferred call would do.
/// * `!Send`: it belongs to the loop's thread, and the closure is never re-entered.
#[derive(Clone)]
pub struct DeferredCall {
    state: Rc<DeferState>,
    call: Rc<Call>,
}

impl DeferredCall {
    /// Runs the closure now, or marks it to run once when the current section ends.
    pub fn call(&self) {
        self.state.call(&self.call);
    }

    /// Whether it waits for the end of a section.
    pub fn is_pending(&self) -> bool {
        self.call.pending.get()
    }
}

impl fmt::Debug for DeferredCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeferredCall")
            .field("pending", &self.is_pending())
            .finish()
    }
}

/// An open defer section (QEMU's `defer_call_begin()`); dropping it is `defer_call_end()`.
/// `!Send`: it belongs to the loop's thread.
#[must_use = "the section ends when this is dropped"]
pub struct DeferSection {
    state: Rc<DeferState>,
}

impl Drop for DeferSection {
    fn drop(&mut self) {
        self.state.end();
    }
}

impl fmt::Debug for DeferSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeferSection")
            .field("depth", &self.state.depth.get())
            .finish()
    }
}
