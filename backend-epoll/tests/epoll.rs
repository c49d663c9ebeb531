//! epoll-specific behaviour: a burst of more ready fds than one `epoll_wait` returns. (The
//! millisecond fallback without `epoll_pwait2` is in `conformance.rs`, which reruns the suite
//! under it.)

use std::cell::Cell;
use std::os::fd::AsFd;
use std::rc::Rc;

use aio_backend_epoll::{EpollLoop, EVENTS_PER_WAIT};
use aio_conformance::{raise_fd_limit, write_byte, Pipe};
use aio_loop::{AioContext, FdHandler};

/// 300 fds ready at once (more than the 128 events one `epoll_wait` returns) are all dispatched
/// in one iteration: the monitor asks again without blocking when a wait fills its buffer.
#[test]
fn a_burst_of_more_ready_fds_than_one_wait_returns_is_dispatched_in_one_iteration() {
    const FDS: usize = 300;
    const { assert!(FDS > 2 * EVENTS_PER_WAIT) };
    raise_fd_limit();
    let ctx = AioContext::new(EpollLoop::new().unwrap()).unwrap();
    let pipes: Vec<Rc<Pipe>> = (0..FDS).map(|_| Rc::new(Pipe::new())).collect();
    let calls = Rc::new(Cell::new(0));
    for p in &pipes {
        let (c, pipe) = (calls.clone(), p.clone());
        ctx.set_fd_handler(
            p.read.as_fd(),
            FdHandler::new().on_read(move |_| {
                c.set(c.get() + 1);
                pipe.drain();
            }),
        )
        .unwrap();
    }
    for p in &pipes {
        write_byte(&p.write);
    }
    let before = ctx.counters().iterations;
    ctx.poll(true);
    assert_eq!(calls.get(), FDS, "every ready fd in the one iteration");
    assert_eq!(ctx.counters().iterations - before, 1);
}
