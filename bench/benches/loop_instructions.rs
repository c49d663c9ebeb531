//! The loop's own cost in instructions, which a noisy machine does not move: `N` iterations of
//! criterion's `iteration/epoll/1` (a byte written to the one registered pipe, `poll(true)`,
//! its read handler drains it), for `scripts/loop_instructions.sh` to run under callgrind.
//!
//! `cargo bench -p aio-bench --bench loop_instructions [-- N]` runs 1,000,000 iterations and
//! prints the mean wall time of one. Under callgrind the script runs two counts and takes the
//! difference, so setup and exit cancel out.

use std::hint::black_box;
use std::rc::Rc;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_conformance::{drain_fd, write_byte, Pipe};
use aio_loop::{AioContext, FdHandler};

fn main() {
    // `cargo bench` passes `--bench`; a number among the arguments is the count.
    let iterations: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let ctx = AioContext::new(EpollLoop::new().expect("epoll")).expect("context");
    let active = Rc::new(Pipe::new());
    let reader = active.clone();
    ctx.set_fd_handler(
        &active.read,
        FdHandler::new().on_read(move |_| {
            drain_fd(&reader.read);
        }),
    )
    .expect("handler");
    let start = Instant::now();
    for _ in 0..iterations {
        write_byte(&active.write);
        black_box(ctx.poll(true));
    }
    let ns = start.elapsed().as_nanos() as f64 / iterations as f64;
    println!("loop_instructions: {iterations} iterations, {ns:.0} ns each");
}
