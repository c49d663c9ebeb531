//! The callbacks the loop runs: [`LoopCallback`] in its two re-entrancy modes, and the
//! `io_poll` checks and polling-mode hooks of fd handlers.
//!
//! This module owns how a callback is kept and invoked (and refused while it runs further up
//! the stack), never when it runs. It is generic over the argument the callbacks get (`C`: the
//! tables keep `LoopCallback<AioContext<L>>`), so it never names the context; a leaf, which
//! the tables and the context name.

use std::cell::RefCell;

/// A boxed callback that runs on the loop thread with access to the context.
pub(crate) type BoxedLoopFn<C> = Box<dyn FnMut(&C)>;
/// A boxed callback that may be re-entered by a nested poll.
pub(crate) type ReentrantLoopFn<C> = Box<dyn Fn(&C)>;

/// A callback the loop runs, in one of two re-entrancy modes.
pub(crate) enum LoopCallback<C> {
    /// `FnMut`: never re-entered; a nested poll skips it while it runs further up the stack.
    Exclusive(RefCell<BoxedLoopFn<C>>),
    /// `Fn`: may be re-entered by a nested poll (it keeps its own state in cells).
    Reentrant(ReentrantLoopFn<C>),
}

impl<C> LoopCallback<C> {
    pub(crate) fn exclusive(f: impl FnMut(&C) + 'static) -> Self {
        LoopCallback::Exclusive(RefCell::new(Box::new(f)))
    }

    pub(crate) fn reentrant(f: impl Fn(&C) + 'static) -> Self {
        LoopCallback::Reentrant(Box::new(f))
    }

    /// Runs the callback unless it is exclusive and already running; returns whether it ran.
    pub(crate) fn invoke(&self, ctx: &C) -> bool {
        match self {
            LoopCallback::Exclusive(cell) => match cell.try_borrow_mut() {
                Ok(mut f) => {
                    f(ctx);
                    true
                }
                Err(_) => false,
            },
            LoopCallback::Reentrant(f) => {
                f(ctx);
                true
            }
        }
    }

    /// Whether `invoke` would refuse to run it now.
    pub(crate) fn is_busy(&self) -> bool {
        match self {
            LoopCallback::Exclusive(cell) => cell.try_borrow_mut().is_err(),
            LoopCallback::Reentrant(_) => false,
        }
    }
}

/// A cheap, syscall-free readiness check.
pub(crate) type PollCheck = RefCell<Box<dyn FnMut() -> bool>>;
/// A hook run when busy polling of a handler begins or ends.
pub(crate) type PollHook = RefCell<Box<dyn FnMut()>>;
