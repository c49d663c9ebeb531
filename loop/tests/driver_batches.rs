//! The driver with an engine that holds its completions until told: a batch released at once
//! is one batch for the deferred calls, a nested `poll()` runs none of the outer section's
//! calls, a stale per-request token (its slot reused) reaches the engine-wide callback, and a
//! refused `try_submit_with` hands its state back.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use aio_backend_poll::PollLoop;
use aio_core::engine::{AlignedBuf, Completion, IoBuffers, IoEngine, IoFile, Request};
use aio_core::engine::{RequestError, SubmitError};
use aio_core::Notifier;
use aio_loop::AioContext;

/// Completes nothing until [`HeldEngine::release`]; then every held request at once.
struct HeldEngine {
    notifier: Notifier,
    held: Vec<Request>,
    done: VecDeque<Completion>,
    /// Every token the engine was given, in order.
    seen: Vec<u64>,
    /// Plug depth, and what it was at each submit.
    plugged: i32,
    plugged_at_submit: Vec<i32>,
    /// Refuse every request (as an engine shutting down does).
    refuse: bool,
}

impl HeldEngine {
    fn new() -> Self {
        HeldEngine {
            notifier: Notifier::new().unwrap(),
            held: Vec::new(),
            done: VecDeque::new(),
            seen: Vec::new(),
            plugged: 0,
            plugged_at_submit: Vec::new(),
            refuse: false,
        }
    }

    /// Completes every held request (a full read) and signals the notifier once.
    fn release(&mut self) {
        for r in self.held.drain(..) {
            let len = r.op.len();
            self.done.push_back(r.complete(Ok(len)));
        }
        self.notifier.notify().unwrap();
    }

    /// Completes a request with an arbitrary token, as a buggy or late engine would.
    fn complete_with_token(&mut self, token: u64) {
        let file = IoFile::new(std::fs::File::open("/dev/null").unwrap());
        let mut r = Request::read(&file, 0, AlignedBuf::new(512), 0);
        r.token = token;
        self.done.push_back(r.complete(Ok(0)));
        self.notifier.notify().unwrap();
    }
}

impl IoEngine for HeldEngine {
    fn name(&self) -> &'static str {
        "held"
    }
    fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
        if self.refuse {
            let shut = RequestError::ShutDown { engine: "held" };
            return Err(SubmitError::new(shut, request));
        }
        self.seen.push(request.token);
        self.plugged_at_submit.push(self.plugged);
        self.held.push(request);
        Ok(())
    }
    fn plug(&mut self) {
        self.plugged += 1;
    }
    fn unplug(&mut self) {
        self.plugged -= 1;
    }
    fn set_max_batch(&mut self, _max: usize) {}
    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }
    fn has_completions(&self) -> bool {
        !self.done.is_empty()
    }
    fn notifier(&self) -> &Notifier {
        &self.notifier
    }
    fn cancel(&mut self, _token: u64) -> bool {
        false
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.done.len()
    }
    fn drain(&mut self) -> Vec<Completion> {
        self.release();
        self.done.drain(..).collect()
    }
}

fn null_file() -> IoFile {
    IoFile::new(std::fs::File::open("/dev/null").unwrap())
}

#[test]
fn a_batch_of_64_released_together_runs_its_deferred_call_once() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let calls = Rc::new(Cell::new(0u32));
    let c = calls.clone();
    let irq = ctx.deferred_call(move || c.set(c.get() + 1));
    let delivered = Rc::new(Cell::new(0u32));
    let d = delivered.clone();
    let attached = ctx
        .attach_engine(HeldEngine::new(), move |_, _| {
            d.set(d.get() + 1);
            irq.call();
        })
        .unwrap();
    let file = null_file();
    for t in 0..64 {
        attached
            .submit(Request::read(&file, 0, AlignedBuf::new(512), t))
            .unwrap();
    }
    attached.with_engine(HeldEngine::release);
    while delivered.get() < 64 {
        ctx.poll(true);
    }
    assert_eq!(calls.get(), 1, "one deferred call for the batch of 64");
}

#[test]
fn a_nested_poll_runs_none_of_the_outer_sections_calls() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let calls = Rc::new(Cell::new(0u32));
    let c = calls.clone();
    let irq = ctx.deferred_call(move || c.set(c.get() + 1));
    let seen_in_nested = Rc::new(RefCell::new(Vec::new()));
    let s = seen_in_nested.clone();
    let calls_in = calls.clone();
    let attached = ctx
        .attach_engine(HeldEngine::new(), move |ctx, done| {
            irq.call();
            if done.token == 0 {
                // A callback that runs a nested loop: the outer section's call must wait.
                ctx.poll(false);
                s.borrow_mut().push(calls_in.get());
            }
        })
        .unwrap();
    let file = null_file();
    for t in 0..8 {
        attached
            .submit(Request::read(&file, 0, AlignedBuf::new(512), t))
            .unwrap();
    }
    attached.with_engine(HeldEngine::release);
    while attached.delivered() < 8 {
        ctx.poll(true);
    }
    assert_eq!(
        *seen_in_nested.borrow(),
        vec![0],
        "no call ran inside the nested poll"
    );
    assert_eq!(calls.get(), 1, "the call ran once, after the batch");
}

#[test]
fn a_stale_per_request_token_goes_to_the_engine_wide_callback() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let wide = Rc::new(RefCell::new(Vec::new()));
    let w = wide.clone();
    let attached = ctx
        .attach_engine(HeldEngine::new(), move |_, c| w.borrow_mut().push(c.token))
        .unwrap();
    let file = null_file();
    let own = Rc::new(Cell::new(0u32));
    let o = own.clone();
    attached
        .submit_with(
            Request::read(&file, 0, AlignedBuf::new(512), 1),
            move |_, _, _| o.set(o.get() + 1),
        )
        .unwrap();
    let first = attached.with_engine(|e| e.seen[0]);
    attached.with_engine(HeldEngine::release);
    while own.get() < 1 {
        ctx.poll(true);
    }
    // The slot is reused by the next request: its generation moves on.
    let o = own.clone();
    attached
        .submit_with(
            Request::read(&file, 0, AlignedBuf::new(512), 2),
            move |_, _, _| o.set(o.get() + 10),
        )
        .unwrap();
    // A completion carrying the first request's engine token (delivered late, or twice).
    attached.with_engine(|e| e.complete_with_token(first));
    for _ in 0..4 {
        ctx.poll(false);
    }
    assert_eq!(
        own.get(),
        1,
        "the second request's callback did not run for a stale token"
    );
    assert_eq!(
        wide.borrow().as_slice(),
        &[first],
        "the stale token went to the engine-wide callback"
    );
    attached.with_engine(HeldEngine::release);
    while own.get() < 11 {
        ctx.poll(true);
    }
}

#[test]
fn detach_is_refused_while_another_handle_lives_and_returns_the_engine_after() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let attached = ctx.attach_engine(HeldEngine::new(), |_, _| {}).unwrap();
    let file = null_file();
    attached
        .submit(Request::read(&file, 0, AlignedBuf::new(512), 7))
        .unwrap();
    let other = attached.clone();
    let attached = match attached.detach(&ctx) {
        Err((aio_core::AioError::EngineShared { holders }, handle)) => {
            assert_eq!(holders, 1, "the clone, and nothing the loop holds");
            handle
        }
        other => panic!("detach with a clone alive: {:?}", other.err().map(|e| e.0)),
    };
    // Refused without changing anything: the engine is still attached and served.
    assert!(attached.with_engine(|e| ctx.has_fd_handler(&e.notifier)));
    drop(other);
    let engine = attached.detach(&ctx).expect("the last handle detaches");
    assert_eq!(engine.seen, [7]);
    assert!(!ctx.has_fd_handler(&engine.notifier));
    assert_eq!(ctx.fd_handler_count(), 0);
}

#[test]
fn the_handle_plugs_counts_and_lets_busy_polling_find_completions() {
    use aio_loop::PollParams;
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    ctx.set_poll_params(PollParams::iothread());
    let handle: Rc<RefCell<Option<aio_loop::AttachedEngine<PollLoop, HeldEngine>>>> = Rc::default();
    let in_flight_seen = Rc::new(RefCell::new(Vec::new()));
    let (h, seen) = (handle.clone(), in_flight_seen.clone());
    let attached = ctx
        .attach_engine(HeldEngine::new(), move |_, _| {
            let h = h.borrow();
            seen.borrow_mut().push(h.as_ref().unwrap().in_flight());
        })
        .unwrap();
    *handle.borrow_mut() = Some(attached.clone());
    attached.plug();
    assert_eq!(attached.with_engine(|e| e.plugged), 1);
    attached.unplug();
    assert_eq!(attached.with_engine(|e| e.plugged), 0);
    let file = null_file();
    for t in 0..3 {
        attached
            .submit(Request::read(&file, 0, AlignedBuf::new(512), t))
            .unwrap();
    }
    assert_eq!(attached.in_flight(), 3);
    // Nothing completed: busy polling the engine's check finds nothing (a 200 ms timer ends
    // the wait; one that had expired before the wait began would leave nothing to poll for).
    let timer = ctx.timer_new(|_| {});
    ctx.timer_mod_in(timer, std::time::Duration::from_millis(200))
        .unwrap();
    ctx.poll(true);
    let c = ctx.counters();
    assert!(c.poll_attempts >= 1, "busy polling ran: {c:?}");
    assert_eq!(c.poll_hits, 0, "nothing to find: {c:?}");
    // Released: the check finds them, and each callback sees the rest still in flight.
    attached.with_engine(|e| e.release());
    while attached.delivered() < 3 {
        ctx.poll(true);
    }
    let c = ctx.counters();
    assert!(
        c.poll_hits >= 1,
        "busy polling found the completions: {c:?}"
    );
    assert_eq!(*in_flight_seen.borrow(), [2, 1, 0]);
    assert_eq!(
        attached.safety_net_runs(),
        0,
        "no nested loop needed the safety net"
    );
    handle.borrow_mut().take();
}

#[test]
fn requests_submitted_by_completion_callbacks_go_out_as_one_plugged_batch() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let handle: Rc<RefCell<Option<aio_loop::AttachedEngine<PollLoop, HeldEngine>>>> = Rc::default();
    let h = handle.clone();
    let file = Rc::new(null_file());
    let f = file.clone();
    let attached = ctx
        .attach_engine(HeldEngine::new(), move |_, c| {
            if c.token < 100 {
                let h = h.borrow();
                let follow_up = Request::read(&f, 0, AlignedBuf::new(512), 100 + c.token);
                h.as_ref().unwrap().submit(follow_up).unwrap();
            }
        })
        .unwrap();
    *handle.borrow_mut() = Some(attached.clone());
    for t in 0..2 {
        attached
            .submit(Request::read(&file, 0, AlignedBuf::new(512), t))
            .unwrap();
    }
    attached.with_engine(|e| e.release());
    while attached.delivered() < 2 {
        ctx.poll(true);
    }
    let (seen, plugged_at, plugged) =
        attached.with_engine(|e| (e.seen.clone(), e.plugged_at_submit.clone(), e.plugged));
    assert_eq!(seen, [0, 1, 100, 101]);
    assert_eq!(
        plugged_at,
        [0, 0, 1, 1],
        "the callbacks' requests went in under a plug"
    );
    assert_eq!(plugged, 0, "unplugged after the batch");
    handle.borrow_mut().take();
}

/// State that cannot be cloned: a reply owed to someone.
struct Owed(u32);

#[test]
fn try_submit_with_hands_the_state_back_on_refusal_and_to_the_callback_otherwise() {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let attached = ctx
        .attach_engine(HeldEngine::new(), |_, _| {
            panic!("not the engine-wide callback")
        })
        .unwrap();
    let file = null_file();
    attached.with_engine(|e| e.refuse = true);
    let mut buf = AlignedBuf::new(512);
    buf[0] = 9;
    let request = Request::read(&file, 0, buf, 5);
    let refused = attached.try_submit_with(request, Owed(1), |_, _, _, _| {
        panic!("a refused request has no completion")
    });
    let Err((refused, Owed(1))) = refused else {
        panic!("the state comes back with the refusal");
    };
    assert!(matches!(refused.error, RequestError::ShutDown { .. }));
    assert_eq!(refused.request.token, 5, "the caller's token, untouched");
    let IoBuffers::One(buf) = refused.request.op.into_buffers() else {
        panic!("the request's buffer comes back");
    };
    assert_eq!(buf[0], 9);

    attached.with_engine(|e| e.refuse = false);
    let got = Rc::new(Cell::new(None));
    let g = got.clone();
    let request = Request::read(&file, 0, AlignedBuf::new(512), 6);
    attached
        .try_submit_with(request, Owed(2), move |_, _, done, Owed(n)| {
            g.set(Some((n, done.token)))
        })
        .map_err(|_| "taken")
        .unwrap();
    attached.with_engine(HeldEngine::release);
    while got.get().is_none() {
        ctx.poll(true);
    }
    assert_eq!(got.get(), Some((2, 6)), "the state and the caller's token");
}
