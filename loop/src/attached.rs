//! Attaching an engine to an [`AioContext`]: completions delivered in the loop.
//!
//! This module owns the glue between one engine and one context (QEMU's direct completion
//! processing in the notifier callback, with a bottom half only as the nested-loop safety net):
//!
//! * the engine's notifier is registered with `io_read` (clear it, process completions) and
//!   `io_poll` (the engine's syscall-free `has_completions`), so adaptive polling finds
//!   completions without a wakeup (QEMU's thread-pool notifier/io_poll change: QD1 69.87 ->
//!   49.45 µs);
//! * completions are delivered **directly** from that callback, one at a time, to the user's
//!   callback;
//! * before each delivery a bottom half is scheduled as a safety net: if a completion callback
//!   runs a nested `poll()`, the bottom half delivers the completions this call already took
//!   from the engine, and sends requests the batch holds back. When everything is delivered
//!   the bottom half is cancelled, so the common case costs no extra iteration;
//! * requests that completion callbacks submit are batched (the engine is plugged during the
//!   deliveries and unplugged after them), so a queue refilled from its completions costs one
//!   submission call per batch, not one per request; the engine sizes those batches by the
//!   work the kernel still holds (the [batch rule](aio_core::kit::queue#the-batch-rule)), so a
//!   device that drained while the completions were delivered is refilled at once.
//!
//! * a request may carry its own completion callback ([`AttachedEngine::submit_with`]): it
//!   runs instead of the engine-wide one, once, with the handle, so it can submit the next
//!   request itself. The driver tells such requests apart by a token bit it reserves
//!   ([`PER_REQUEST_TOKEN_BIT`]) and gives the caller's token back in the completion.
//!
//! It never touches the engine's internals: only the [`IoEngine`] trait.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::{Rc, Weak};

use crate::context::bh_table::BottomHalf;
use crate::context::handlers::FdHandler;
use crate::AioContext;
use aio_core::engine::{Completion, IoEngine, Request, RequestError, SubmitError};
use aio_core::kit::{SlotId, Slots};
use aio_core::AioError;
use aio_core::EventLoop;

type CompletionFn<L> = Box<dyn Fn(&AioContext<L>, Completion)>;
type PerRequestFn<L, E> = Box<dyn FnOnce(&AioContext<L>, &AttachedEngine<L, E>, Completion)>;

/// The token bit an attached engine reserves for requests with their own completion callback
/// ([`AttachedEngine::submit_with`]): the engine sees that bit and a slot number in place of
/// the caller's token, which the completion carries again when it reaches the callback.
/// Tokens given to [`AttachedEngine::submit`] must not have it set
/// ([`RequestError::ReservedToken`]).
pub const PER_REQUEST_TOKEN_BIT: u64 = 1 << 62;

/// Where a request's own completion goes.
pub(crate) enum Delivery<L: EventLoop, E: IoEngine> {
    /// A callback ([`AttachedEngine::submit_with`]).
    Callback(PerRequestFn<L, E>),
    /// The state a [`RequestFuture`](crate::task::RequestFuture) shares with its request: no
    /// allocation beyond that state.
    Future(Rc<dyn RequestSlot>),
    /// Not set yet: [`AttachedEngine::try_submit_with`] sets it once the engine has taken the
    /// request (completions are delivered by the loop, never inside `submit`).
    Unset,
}

/// A request's own delivery, and the caller's token it replaced.
struct PerRequest<L: EventLoop, E: IoEngine> {
    engine_token: u64,
    user_token: u64,
    delivery: Delivery<L, E>,
}

/// The end of a request whose completion goes to a future's shared state, not a callback.
pub(crate) trait RequestSlot {
    /// Takes the completion (the engine is done with the request's memory).
    fn complete(&self, completion: Completion);
}

/// An attached engine seen by a future of one of its requests, with its types erased: all
/// such a future asks of it is to cancel the request when dropped early.
pub(crate) trait CancelRequest {
    /// [`AttachedEngine::cancel_request`].
    fn cancel_request(&self, id: RequestId) -> bool;
}

impl<L: EventLoop, E: IoEngine> CancelRequest for Driver<L, E> {
    fn cancel_request(&self, id: RequestId) -> bool {
        self.cancel_token(id.0)
    }
}

pub(crate) struct Driver<L: EventLoop, E: IoEngine> {
    engine: RefCell<E>,
    ready: RefCell<VecDeque<Completion>>,
    on_complete: CompletionFn<L>,
    per_request: RefCell<Slots<PerRequest<L, E>>>,
    safety_net: RefCell<Option<BottomHalf>>,
    delivered: Cell<u64>,
    net_runs: Cell<u64>,
    /// The driver holds a plug around a batch of deliveries.
    batching: Cell<bool>,
    /// The engine's notifier fds, as registered (the first is the engine's own).
    fds: Vec<RawFd>,
    /// The context attached to (its address), so that `detach` refuses another one.
    context: usize,
}

impl<L: EventLoop, E: IoEngine> Driver<L, E> {
    /// [`AttachedEngine::cancel`].
    fn cancel_token(&self, token: u64) -> bool {
        match self.engine.try_borrow_mut() {
            Ok(mut engine) => engine.cancel(token),
            Err(_) => false,
        }
    }

    /// Hands `completion` to its own callback, if it has one, or to the engine-wide one.
    fn deliver(self: &Rc<Self>, ctx: &AioContext<L>, mut completion: Completion) {
        if completion.token & PER_REQUEST_TOKEN_BIT != 0 {
            let index = completion.token as u32;
            let mut table = self.per_request.borrow_mut();
            let ours = table
                .get_index(index)
                .is_some_and(|p| p.engine_token == completion.token);
            if ours {
                let entry = table.remove_index(index).expect("checked above");
                drop(table);
                completion.token = entry.user_token;
                match entry.delivery {
                    Delivery::Callback(callback) => {
                        let handle = AttachedEngine {
                            driver: self.clone(),
                        };
                        callback(ctx, &handle, completion);
                    }
                    Delivery::Future(slot) => slot.complete(completion),
                    Delivery::Unset => {}
                }
                return;
            }
        }
        (self.on_complete)(ctx, completion);
    }

    /// Delivers every waiting completion. Re-entrant: a completion callback that runs a nested
    /// loop gets the remaining completions delivered inside it, by the safety-net bottom half
    /// (for completions this call already took from the engine) or by the notifier handler
    /// (for new ones).
    fn process(self: &Rc<Self>, ctx: &AioContext<L>) -> bool {
        // Requests submitted by the completion callbacks go out together, in one kernel call,
        // after the batch (QEMU submits after processing completions). A nested delivery
        // (a callback ran a nested loop) first sends what the outer batch holds, so that the
        // nested loop can wait for it, and batching stops for the rest of the outer batch.
        // Calls deferred by the callbacks (a virtqueue's interrupt) run once, after the batch
        // is delivered and its requests are sent, when this section (or an outer one) ends.
        let _section = ctx.defer_section();
        let outer = !self.batching.get();
        if outer {
            if let Ok(mut engine) = self.engine.try_borrow_mut() {
                engine.plug();
                self.batching.set(true);
            }
        } else {
            self.end_batch();
        }
        let mut armed = false;
        let mut progress = false;
        loop {
            let next = self.ready.borrow_mut().pop_front();
            let completion = match next {
                Some(c) => c,
                None => {
                    let refilled = match self.engine.try_borrow_mut() {
                        Ok(mut engine) => engine.poll_completions(&mut self.ready.borrow_mut()),
                        Err(_) => 0,
                    };
                    if refilled == 0 {
                        break;
                    }
                    continue;
                }
            };
            // Scheduled before each user callback (a no-op while still scheduled), so that a
            // nested loop sees the completions still queued here (the nested-loop safety net),
            // also after a nested delivery cancelled it.
            if let Some(bh) = self.safety_net.borrow().as_ref() {
                bh.schedule();
            }
            armed = true;
            self.delivered.set(self.delivered.get() + 1);
            progress = true;
            self.deliver(ctx, completion);
        }
        if outer {
            // Tasks these completions woke run now, inside the batch, so that the requests
            // they submit go out together with the callbacks' (one submission call, not one
            // per task): what a callback resubmitting from its completion gets.
            if progress {
                ctx.run_woken_tasks();
            }
            self.end_batch();
        }
        if armed {
            // Everything is delivered: the common case costs no extra iteration.
            if let Some(bh) = self.safety_net.borrow().as_ref() {
                bh.cancel();
            }
        }
        progress
    }

    /// Sends the batch the callbacks built, if one is open.
    fn end_batch(&self) {
        if self.batching.get() {
            // Only a successful unplug closes the batch; if the engine is borrowed right now
            // (a loop run from inside `with_engine`), a later delivery closes it.
            if let Ok(mut engine) = self.engine.try_borrow_mut() {
                engine.unplug();
                self.batching.set(false);
            }
        }
    }

    fn has_work(&self) -> bool {
        !self.ready.borrow().is_empty()
            || self
                .engine
                .try_borrow()
                .map(|e| e.has_completions())
                .unwrap_or(false)
    }
}

/// An engine attached to a context with [`AioContext::attach_engine`]. Submit through it;
/// completions arrive in the callback given at attachment, on the loop thread.
///
/// Dropping the handle leaves the engine attached (the context keeps it until
/// [`AttachedEngine::detach`] or the context is dropped): a registered notifier never dangles.
///
/// The handle is `!Send` (the engine lives on its loop's thread) and cheap to clone (tasks
/// and callbacks keep their own); [`detach`](AttachedEngine::detach) needs the last one.
pub struct AttachedEngine<L: EventLoop, E: IoEngine> {
    pub(crate) driver: Rc<Driver<L, E>>,
}

impl<L: EventLoop, E: IoEngine> Clone for AttachedEngine<L, E> {
    fn clone(&self) -> Self {
        AttachedEngine {
            driver: self.driver.clone(),
        }
    }
}

/// A request submitted with [`AttachedEngine::submit_with`], for
/// [`AttachedEngine::cancel_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId(u64);

impl<L: EventLoop, E: IoEngine> fmt::Debug for AttachedEngine<L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachedEngine")
            .field("fds", &self.driver.fds)
            .field("delivered", &self.driver.delivered.get())
            .finish_non_exhaustive()
    }
}

impl<L: EventLoop + 'static> AioContext<L> {
    /// Attaches `engine`: its notifier is registered with `io_read` and `io_poll`, and each
    /// completion is passed to `on_complete` on this loop's thread.
    ///
    /// `on_complete` is `Fn`, not `FnMut`, because it may be re-entered: a completion callback
    /// that runs a nested `poll()` can receive further completions inside it. Keep mutable
    /// state in `Cell` / `RefCell`. Requests submitted with
    /// [`AttachedEngine::submit_with`] go to their own callback instead.
    pub fn attach_engine<E: IoEngine + 'static>(
        &self,
        engine: E,
        on_complete: impl Fn(&AioContext<L>, Completion) + 'static,
    ) -> Result<AttachedEngine<L, E>, AioError> {
        let fds = engine.notifiers().iter().map(|n| n.as_raw_fd()).collect();
        let driver = Rc::new(Driver {
            engine: RefCell::new(engine),
            ready: RefCell::new(VecDeque::new()),
            on_complete: Box::new(on_complete),
            per_request: RefCell::new(Slots::new()),
            safety_net: RefCell::new(None),
            delivered: Cell::new(0),
            net_runs: Cell::new(0),
            batching: Cell::new(false),
            fds,
            context: self as *const AioContext<L> as usize,
        });
        // Weak: the bottom half's slot outlives a detach by one iteration.
        let d: Weak<Driver<L, E>> = Rc::downgrade(&driver);
        let bh = self.bh_new_reentrant(move |ctx| {
            if let Some(d) = d.upgrade() {
                d.net_runs.set(d.net_runs.get() + 1);
                d.process(ctx);
            }
        });
        *driver.safety_net.borrow_mut() = Some(bh);
        let count = driver.fds.len();
        for index in 0..count {
            if let Err(e) = self.register_notifier(&driver, index) {
                for earlier in 0..index {
                    let engine = driver.engine.borrow();
                    let _ = self.remove_fd_handler(engine.notifiers()[earlier]);
                }
                if let Some(bh) = driver.safety_net.borrow_mut().take() {
                    bh.delete();
                }
                return Err(e);
            }
        }
        Ok(AttachedEngine { driver })
    }

    /// Registers the engine's `index`-th notifier: `io_read` clears it (the engine's own with
    /// `clear_notifier`, another by reading it) and delivers, `io_poll` is the engine's
    /// syscall-free check.
    fn register_notifier<E: IoEngine + 'static>(
        &self,
        driver: &Rc<Driver<L, E>>,
        index: usize,
    ) -> Result<(), AioError> {
        // Weak: only handles own the driver, so that `detach` knows it holds the last one.
        let weak = Rc::downgrade(driver);
        let (on_read, on_poll, on_ready) = (weak.clone(), weak.clone(), weak);
        // Re-entrant callbacks: a nested loop inside a completion callback must be able to
        // deliver new completions through the same handler.
        let handler = FdHandler::new()
            .on_read_reentrant(move |ctx| {
                let Some(driver) = on_read.upgrade() else {
                    return;
                };
                if let Ok(engine) = driver.engine.try_borrow() {
                    if index == 0 {
                        engine.clear_notifier();
                    } else if let Some(n) = engine.notifiers().get(index) {
                        n.test_and_clear();
                    }
                }
                driver.process(ctx);
            })
            .on_poll(move || on_poll.upgrade().is_some_and(|d| d.has_work()))
            .on_poll_ready_reentrant(move |ctx| {
                if let Some(driver) = on_ready.upgrade() {
                    driver.process(ctx);
                }
            });
        // The engine, and so its notifiers, live in the driver until `detach`, which removes
        // the handlers first.
        let engine = driver.engine.borrow();
        self.set_fd_handler(engine.notifiers()[index], handler)
    }
}

impl<L: EventLoop, E: IoEngine> AttachedEngine<L, E> {
    /// Submits a request (see [`IoEngine::submit`]); its completion goes to the engine-wide
    /// callback. A token with [`PER_REQUEST_TOKEN_BIT`] set is refused
    /// ([`RequestError::ReservedToken`]).
    pub fn submit(&self, request: Request) -> Result<(), SubmitError> {
        if request.token & PER_REQUEST_TOKEN_BIT != 0 {
            let token = request.token;
            return Err(SubmitError::new(
                RequestError::ReservedToken {
                    token,
                    bit: PER_REQUEST_TOKEN_BIT.trailing_zeros(),
                    reserved_for: "an attached engine's per-request completions",
                },
                request,
            ));
        }
        self.driver.engine.borrow_mut().submit(request)
    }

    /// Submits a request whose completion goes to `on_complete` instead of the engine-wide
    /// callback: once, on the loop's thread, with this handle, so that it can submit the next
    /// request itself (with `submit_with` again, or `submit`), run a nested `poll()`, or
    /// detach nothing (detaching from inside a callback is refused).
    ///
    /// The completion carries the request's own token. The engine sees another one while the
    /// request is in flight (see [`PER_REQUEST_TOKEN_BIT`]), so [`AttachedEngine::cancel`]
    /// does not find it by the caller's token. If the engine is dropped first (detached and
    /// dropped, or dropped with the context), the callback is dropped without running, after
    /// the engine has finished with the request's memory.
    ///
    /// The returned [`RequestId`] cancels it ([`AttachedEngine::cancel_request`]).
    pub fn submit_with(
        &self,
        request: Request,
        on_complete: impl FnOnce(&AioContext<L>, &AttachedEngine<L, E>, Completion) + 'static,
    ) -> Result<RequestId, SubmitError>
    where
        L: 'static,
        E: 'static,
    {
        self.submit_delivering(request, Delivery::Callback(Box::new(on_complete)))
    }

    /// [`submit_with`](AttachedEngine::submit_with), with the callback's state kept apart
    /// until the engine has taken the request: a refusal hands `state` back beside the
    /// request (untouched, with its memory), so that a caller whose state cannot be cloned
    /// (a reply it owes someone) still has it. On success `on_complete` gets `state` with the
    /// completion.
    pub fn try_submit_with<S: 'static>(
        &self,
        request: Request,
        state: S,
        on_complete: impl FnOnce(&AioContext<L>, &AttachedEngine<L, E>, Completion, S) + 'static,
    ) -> Result<RequestId, (SubmitError, S)>
    where
        L: 'static,
        E: 'static,
    {
        let (slot, engine_token) = match self.submit_slot(request, Delivery::Unset) {
            Ok(taken) => taken,
            Err(refused) => return Err((refused, state)),
        };
        let callback: PerRequestFn<L, E> =
            Box::new(move |ctx, engine, done| on_complete(ctx, engine, done, state));
        if let Some(entry) = self.driver.per_request.borrow_mut().get_mut(slot) {
            entry.delivery = Delivery::Callback(callback);
        }
        Ok(RequestId(engine_token))
    }

    /// Submits a request whose completion goes to `delivery` (see
    /// [`submit_with`](AttachedEngine::submit_with)).
    pub(crate) fn submit_delivering(
        &self,
        request: Request,
        delivery: Delivery<L, E>,
    ) -> Result<RequestId, SubmitError> {
        let (_, engine_token) = self.submit_slot(request, delivery)?;
        Ok(RequestId(engine_token))
    }

    /// Submits `request` with its delivery in the per-request table; the slot it holds there
    /// and the token the engine knows it by.
    fn submit_slot(
        &self,
        mut request: Request,
        delivery: Delivery<L, E>,
    ) -> Result<(SlotId, u64), SubmitError> {
        let user_token = request.token;
        let mut table = self.driver.per_request.borrow_mut();
        let slot = table.next_id();
        // The bit, the slot's generation (30 bits) and its index: unique among live requests
        // (the generation is checked on delivery).
        let engine_token = PER_REQUEST_TOKEN_BIT | (slot.to_u64() & !(0b11 << 62));
        request.token = engine_token;
        table.insert(PerRequest {
            engine_token,
            user_token,
            delivery,
        });
        drop(table);
        match self.driver.engine.borrow_mut().submit(request) {
            Ok(()) => Ok((slot, engine_token)),
            Err(mut refused) => {
                self.driver.per_request.borrow_mut().remove(slot);
                refused.request.token = user_token;
                Err(refused)
            }
        }
    }

    /// The engine as a future of one of its requests sees it (to cancel it).
    pub(crate) fn canceller(&self) -> Rc<dyn CancelRequest>
    where
        L: 'static,
        E: 'static,
    {
        self.driver.clone()
    }

    /// Opens a batch (see [`IoEngine::plug`]).
    pub fn plug(&self) {
        self.driver.engine.borrow_mut().plug();
    }

    /// Closes a batch (see [`IoEngine::unplug`]).
    pub fn unplug(&self) {
        self.driver.engine.borrow_mut().unplug();
    }

    /// Cancels a request submitted with [`submit`](AttachedEngine::submit) (see
    /// [`IoEngine::cancel`]: queued requests always, requests in the kernel where the engine
    /// can); its `ECANCELED` completion is delivered like any other. False when the engine is
    /// in use further up the stack (a callback of [`with_engine`](AttachedEngine::with_engine)).
    pub fn cancel(&self, token: u64) -> bool {
        self.driver.cancel_token(token)
    }

    /// Cancels a request submitted with [`submit_with`](AttachedEngine::submit_with), as
    /// [`cancel`](AttachedEngine::cancel) does; its callback then gets the `ECANCELED`
    /// completion (or the normal one, if the request could not be stopped).
    pub fn cancel_request(&self, id: RequestId) -> bool {
        self.cancel(id.0)
    }

    /// Requests submitted and not yet delivered to the callback.
    pub fn in_flight(&self) -> usize {
        self.driver.engine.borrow().in_flight() + self.driver.ready.borrow().len()
    }

    /// Completions delivered so far.
    pub fn delivered(&self) -> u64 {
        self.driver.delivered.get()
    }

    /// How many times the nested-loop safety net (the bottom half) had to deliver.
    pub fn safety_net_runs(&self) -> u64 {
        self.driver.net_runs.get()
    }

    /// Runs `f` with the engine (for engine-specific calls and statistics). `f` must not call
    /// back into this handle.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut E) -> R) -> R {
        f(&mut self.driver.engine.borrow_mut())
    }

    /// Detaches from `ctx`: undelivered completions are delivered first, the notifier handlers
    /// and the safety net are removed, and the engine is returned (still holding whatever is
    /// in flight; the per-request callbacks of those requests are dropped without running).
    /// Refused, changing nothing and handing the handle back, when called from inside a
    /// callback of `ctx` ([`AioError::EngineBusy`]) or with another context
    /// ([`AioError::WrongContext`]).
    pub fn detach(self, ctx: &AioContext<L>) -> Result<E, (AioError, Self)> {
        if self.driver.context != ctx as *const AioContext<L> as usize {
            return Err((AioError::WrongContext, self));
        }
        if ctx.is_polling() {
            // A callback up the stack may be this engine's: refuse before changing anything.
            return Err((AioError::EngineBusy, self));
        }
        // The loop's handlers and bottom half hold the driver weakly: every other strong
        // reference is another handle or an unfinished future.
        let holders = Rc::strong_count(&self.driver) - 1;
        if holders > 0 {
            return Err((AioError::EngineShared { holders }, self));
        }
        self.driver.process(ctx);
        let removed: Result<(), AioError> = {
            let engine = self.driver.engine.borrow();
            engine
                .notifiers()
                .into_iter()
                .try_for_each(|n| ctx.remove_fd_handler(n))
        };
        if let Err(e) = removed {
            return Err((e, self));
        }
        if let Some(bh) = self.driver.safety_net.borrow_mut().take() {
            bh.delete();
        }
        // No callback is running (the context is not polling), so none holds an upgraded
        // reference, and no other handle exists (checked above).
        match Rc::try_unwrap(self.driver) {
            Ok(driver) => Ok(driver.engine.into_inner()),
            Err(_) => unreachable!("no callback of a context that is not polling holds the driver"),
        }
    }
}
