//! The io_uring monitor says when a wait would find events without a system call
//! (`EventLoop::needs_wait`, QEMU's `need_wait`), and the loop's busy polling stops for it:
//! an fd outside the poll set (a socket without an `io_poll` check) that becomes ready is
//! served at once, not when the polling window runs out.
mod common;

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use aio_conformance::Pipe;
use aio_core::{Event, EventLoop, Interest, Notifier, Token};
use aio_loop::{AioContext, FakeClock, FdHandler, PollParams};

#[test]
fn the_monitor_needs_a_wait_for_polls_to_arm_and_for_fired_polls() {
    if !common::available() {
        return;
    }
    let mut monitor = common::monitor();
    assert!(!monitor.needs_wait(), "nothing registered");
    let pipe = Pipe::new();
    monitor
        .register(pipe.read.as_fd(), Token(7), Interest::READABLE)
        .unwrap();
    assert!(monitor.needs_wait(), "a poll waits to be armed");
    let mut events = Vec::new();
    monitor.wait(Some(Duration::ZERO), &mut events).unwrap();
    assert!(events.is_empty());
    assert!(!monitor.needs_wait(), "armed, and the pipe is empty");
    pipe.poke();
    // The poll's completion is posted (or held as task work) by the pipe's write; bounded
    // only so that a broken kernel fails instead of hanging.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !monitor.needs_wait() {
        assert!(Instant::now() < deadline, "the fired poll was never seen");
        std::thread::yield_now();
    }
    monitor.wait(Some(Duration::ZERO), &mut events).unwrap();
    assert!(
        events.iter().any(|e| e.token == Token(7) && e.readable),
        "{events:?}"
    );
    // Reported: it needs arming again, which only a wait does.
    assert!(monitor.needs_wait());
}

#[test]
fn busy_polling_stops_when_an_fd_outside_the_poll_set_is_ready() {
    if !common::available() {
        return;
    }
    // A fake clock, one ns per reading: the window lasts as many readings as it has ns, on
    // any machine, and the waits last what the test says.
    let clock = FakeClock::new(1);
    clock.set_step(1);
    let monitor = LongWaits {
        inner: common::monitor(),
        clock: clock.clone(),
    };
    let ctx = AioContext::with_clock(monitor, Box::new(clock.clone())).unwrap();
    // A window up to 1 s: without the monitor's word, the spin below would run all of it.
    ctx.set_poll_params(PollParams::iothread().with_max_ns(1_000_000_000));
    let socket = Rc::new(Pipe::new());
    let served = Rc::new(Cell::new(0));
    let (s, pipe) = (served.clone(), socket.clone());
    ctx.set_fd_handler(
        socket.read.as_fd(),
        FdHandler::new().on_read(move |_| {
            pipe.drain();
            s.set(s.get() + 1);
        }),
    )
    .unwrap();
    // A polled handler (a virtqueue, an engine): ready while `pending`; in `poke` mode its
    // first check makes the pipe readable, as a client's request arriving mid-window.
    let doorbell = Rc::new(Notifier::new().unwrap());
    let (pending, poke) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(false)));
    let bell = doorbell.clone();
    let (p, p2, k, pipe) = (
        pending.clone(),
        pending.clone(),
        poke.clone(),
        socket.clone(),
    );
    ctx.set_fd_handler(
        doorbell.as_fd(),
        FdHandler::new()
            .on_poll(move || {
                if k.replace(false) {
                    pipe.poke();
                }
                p.get()
            })
            .on_poll_ready(move |_| p2.set(false))
            .on_read(move |_| {
                bell.test_and_clear();
            }),
    )
    .unwrap();
    // Waits longer than the window grow it (QEMU's rule: x2 each, from 4 µs).
    for _ in 0..20 {
        doorbell.notify().unwrap();
        assert!(ctx.poll(true));
    }
    assert!(
        ctx.counters().poll_ns >= 100_000_000,
        "the window grew: {:?}",
        ctx.counters()
    );
    // The doorbell's poll fired in each of those: a non-blocking iteration arms it again
    // (an iteration that would poll with a poll to arm goes straight to the wait instead).
    assert!(!ctx.poll(false));
    let before = ctx.counters();
    poke.set(true);
    assert!(ctx.poll(true));
    let after = ctx.counters();
    assert_eq!(served.get(), 1, "the pipe was served in that iteration");
    assert_eq!(
        after.poll_cuts_for_wait,
        before.poll_cuts_for_wait + 1,
        "the window was cut for the monitor's events: {after:?}"
    );
    // Nothing ready anywhere, and the monitor holds nothing: the loop waits as before.
    assert!(!ctx.poll(false));
}

/// The io_uring monitor whose every wait lasts 300 ms on the fake clock (waits longer than
/// the window grow it).
struct LongWaits {
    inner: aio_backend_uring::UringLoop,
    clock: FakeClock,
}

impl EventLoop for LongWaits {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        self.inner.register(fd, token, interest)
    }
    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        self.inner.modify(fd, token, interest)
    }
    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.inner.deregister(fd)
    }
    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()> {
        self.inner.forget_closed(fd)
    }
    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        self.clock.advance(300_000_000);
        self.inner.wait(timeout, events)
    }
    fn registered(&self) -> usize {
        self.inner.registered()
    }
    fn needs_wait(&self) -> bool {
        self.inner.needs_wait()
    }
}
