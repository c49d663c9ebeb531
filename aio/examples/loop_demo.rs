//! A tour of the loop on a monitor picked by a flag: an echo handler on a socket pair, a timer, a
//! bottom half scheduled from another thread, a cross-thread `notify()`, and the counters that
//! explain what the loop did. Plain `aio` (the facade) and the two monitor crates: no test
//! helpers.
//!
//! ```text
//! cargo run -p aio --example loop_demo -- --monitor epoll [--poll-max-ns 32768]
//! ```
//! Monitors: `poll`, `epoll`, `hybrid` (ppoll below 64 fds, epoll from 64 up).

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::Duration;

use aio::{AioContext, EventLoop, FdHandler, Hybrid, PollParams};
use aio_backend_epoll::EpollLoop;
use aio_backend_poll::PollLoop;

/// A connected pair of non-blocking sockets: what one end writes, the other end reads.
fn socket_pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    a.set_nonblocking(true).expect("non-blocking");
    b.set_nonblocking(true).expect("non-blocking");
    (a, b)
}

/// Reads `socket` until it would block; returns the byte count.
fn drain(mut socket: &UnixStream) -> usize {
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return total, // WouldBlock: drained
        }
    }
}

fn run<L: EventLoop>(monitor: L, poll_max_ns: u64) {
    let ctx = AioContext::new(monitor).expect("context");
    ctx.set_poll_params(PollParams::iothread().with_max_ns(poll_max_ns));

    // 1. An fd handler: echo what arrives on one socket into another.
    let (input, input_writer) = socket_pair();
    let (output_reader, output) = socket_pair();
    let echoed = Rc::new(Cell::new(0usize));
    let e = echoed.clone();
    let input = Rc::new(input);
    let i = input.clone();
    ctx.set_fd_handler(
        &*input,
        FdHandler::new().on_read(move |_| {
            let n = drain(&i);
            (&output).write_all(&vec![1u8; n]).expect("echo");
            e.set(e.get() + n);
        }),
    )
    .expect("set_fd_handler");

    // 2. A timer 10 ms out that re-arms itself twice.
    let ticks = Rc::new(Cell::new(0u32));
    let t = ticks.clone();
    let timer = Rc::new(Cell::new(None));
    let tm = timer.clone();
    let id = ctx.timer_new(move |ctx| {
        t.set(t.get() + 1);
        if t.get() < 3 {
            ctx.timer_mod_in(tm.get().unwrap(), Duration::from_millis(10))
                .unwrap();
        }
    });
    timer.set(Some(id));
    ctx.timer_mod_in(id, Duration::from_millis(10)).unwrap();

    // 3. A bottom half scheduled by another thread, and a plain notify.
    let bh_ran = Rc::new(Cell::new(false));
    let b = bh_ran.clone();
    let bh = ctx.bh_new(move |_| b.set(true));
    let notify = ctx.notify_handle();
    let writer = input_writer.try_clone().expect("clone the socket");
    let worker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        (&writer).write_all(&[1]).expect("write");
        (&writer).write_all(&[1]).expect("write");
        bh.schedule();
        std::thread::sleep(Duration::from_millis(5));
        notify.notify();
    });

    while ticks.get() < 3 || !bh_ran.get() || echoed.get() < 2 {
        ctx.poll(true);
    }
    worker.join().unwrap();
    println!("monitor:        {}", ctx.describe_monitor());
    println!("echoed bytes:   {}", echoed.get());
    assert_eq!(drain(&output_reader), echoed.get());
    println!("timer ticks:    {}", ticks.get());
    println!("bottom half:    ran");
    println!("counters:       {:#?}", ctx.counters());
}

fn main() -> ExitCode {
    let mut monitor = String::from("hybrid");
    let mut poll_max_ns = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--monitor", Some(v)) => monitor = v,
            ("--poll-max-ns", Some(v)) => match v.parse() {
                Ok(n) => poll_max_ns = n,
                Err(e) => {
                    eprintln!("--poll-max-ns {v}: {e}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("usage: loop_demo [--monitor poll|epoll|hybrid] [--poll-max-ns N]");
                return ExitCode::from(2);
            }
        }
    }
    match monitor.as_str() {
        "poll" => run(PollLoop::new(), poll_max_ns),
        "epoll" => run(EpollLoop::new().expect("epoll"), poll_max_ns),
        "hybrid" => run(
            Hybrid::new(PollLoop::new(), EpollLoop::new().expect("epoll")),
            poll_max_ns,
        ),
        other => {
            eprintln!("unknown monitor '{other}' (expected poll, epoll or hybrid)");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
