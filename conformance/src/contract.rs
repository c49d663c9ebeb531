//! Contract items of the loop that the main loop suite leaves implicit: the monitor's own
//! errors, the dispatch order within one iteration, and a hang-up through each monitor.
//!
//! This module owns those tests; [`event_loop_conformance!`](crate::event_loop_conformance)
//! runs them with the rest.

use std::cell::RefCell;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::rc::Rc;

use super::Pipe;
use aio_core::{EventLoop, Interest, Token};
use aio_loop::{AioContext, FdHandler};

/// The monitor itself refuses a second registration of an fd (`AlreadyExists`) and a change or
/// removal of an fd it does not watch (`NotFound`), and keeps working.
pub fn monitor_refuses_duplicates_and_unknown_fds<L: EventLoop>(make: impl Fn() -> L) {
    let mut monitor = make();
    let pipe = Pipe::new();
    let other = Pipe::new();
    let fd = pipe.read.as_fd();
    monitor.register(fd, Token(1), Interest::READABLE).unwrap();
    let again = monitor
        .register(fd, Token(2), Interest::READABLE)
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::AlreadyExists, "{again}");
    let unknown = other.read.as_fd();
    let e = monitor
        .modify(unknown, Token(3), Interest::READABLE)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = monitor.deregister(unknown).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(monitor.registered(), 1);
    // Still working: the registered fd is reported readable.
    pipe.poke();
    let mut events = Vec::new();
    monitor
        .wait(Some(std::time::Duration::from_secs(5)), &mut events)
        .unwrap();
    assert!(events.iter().any(|e| e.token == Token(1) && e.readable));
    monitor.deregister(fd).unwrap();
    assert_eq!(monitor.registered(), 0);
}

/// One iteration runs the bottom halves scheduled before it, then the ready handlers, then the
/// expired timers (QEMU's `aio_poll` order).
pub fn one_iteration_runs_bottom_halves_then_handlers_then_timers<L: EventLoop>(
    make: impl Fn() -> L,
) {
    let ctx = AioContext::new(make()).unwrap();
    let order = Rc::new(RefCell::new(Vec::new()));
    let pipe = Pipe::new();
    let o = order.clone();
    let p = Rc::new(pipe);
    let p2 = p.clone();
    ctx.set_fd_handler(
        &p.read,
        FdHandler::new().on_read(move |_| {
            p2.drain();
            o.borrow_mut().push("handler");
        }),
    )
    .unwrap();
    let o = order.clone();
    let timer = ctx.timer_new(move |_| o.borrow_mut().push("timer"));
    ctx.timer_mod(timer, 0).unwrap(); // already expired
    let o = order.clone();
    ctx.bh_schedule_oneshot(move |_| o.borrow_mut().push("bottom half"));
    p.poke();
    ctx.poll(false);
    assert_eq!(*order.borrow(), ["bottom half", "handler", "timer"]);
    ctx.remove_fd_handler(&p.read).unwrap();
    ctx.timer_free(timer).unwrap();
}

/// The write end of a pipe closed: the read end's hang-up reaches `io_read` through the
/// monitor, which reads end of file, removes the handler, and the loop goes on.
pub fn hang_up_reaches_io_read<L: EventLoop>(make: impl Fn() -> L) {
    let ctx = AioContext::new(make()).unwrap();
    let Pipe { read, write } = Pipe::new();
    let read = Rc::new(read);
    let eof = Rc::new(std::cell::Cell::new(false));
    let (r, e) = (read.clone(), eof.clone());
    ctx.set_fd_handler(
        &*read,
        FdHandler::new().on_read(move |ctx| {
            let mut byte = [0u8; 1];
            // SAFETY: a one-byte read into a local buffer from an fd the handler's Rc keeps open.
            let n = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&*r),
                    byte.as_mut_ptr().cast(),
                    1,
                )
            };
            if n == 0 {
                e.set(true);
                ctx.remove_fd_handler(&*r).unwrap();
            }
        }),
    )
    .unwrap();
    drop(write);
    super::poll_until(&ctx, "the hang-up", || eof.get());
    // The loop goes on without the fd.
    let ran = Rc::new(std::cell::Cell::new(false));
    let r2 = ran.clone();
    ctx.bh_schedule_oneshot(move |_| r2.set(true));
    ctx.poll(false);
    assert!(ran.get());
}
