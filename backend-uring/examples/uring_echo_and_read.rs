//! io_uring for both jobs: the loop's fd monitor is `UringLoop` (POLL_ADD) and block I/O goes
//! through `UringEngine`; the probe says what the kernel offers first.
//!
//! ```text
//! cargo run --release -p aio-backend-uring --example uring_echo_and_read
//! ```

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use aio_backend_uring::{probe, UringConfig, UringEngine, UringLoop};
use aio_core::engine::{AlignedBuf, Request};
use aio_core::testing::engine::TempFile;
use aio_core::testing::Pipe;
use aio_core::{AioContext, FdHandler};

fn main() {
    let support = match probe() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("io_uring is not usable here: {why}");
            std::process::exit(2);
        }
    };
    println!("io_uring opcodes used by aio-rs: {:?}", support.opcodes);

    let ctx = AioContext::new(UringLoop::new().expect("uring monitor")).expect("context");

    // A pipe watched through IORING_OP_POLL_ADD.
    let pipe = Rc::new(Pipe::new());
    let got = Rc::new(Cell::new(0usize));
    let (p, g) = (pipe.clone(), got.clone());
    ctx.set_fd_handler(
        pipe.read.as_raw_fd(),
        FdHandler::new().on_read(move |_| g.set(g.get() + p.drain())),
    )
    .expect("handler");

    // Block I/O through the io_uring engine.
    let image = TempFile::with_len(1 << 20, 0x77);
    let file = image.open(0).expect("open");
    let bytes = Rc::new(Cell::new(0usize));
    let b = bytes.clone();
    let engine = ctx
        .attach_engine(
            UringEngine::new(UringConfig::default()).expect("engine"),
            move |_, c| b.set(b.get() + c.result.expect("read")),
        )
        .expect("attach");
    engine.plug();
    for i in 0..16u64 {
        engine
            .submit(Request::read(&file, i * 65536, AlignedBuf::new(65536), i))
            .expect("submit");
    }
    engine.unplug();
    pipe.poke();
    pipe.poke();

    while bytes.get() < 1 << 20 || got.get() < 2 {
        ctx.poll(true);
    }
    println!("pipe bytes: {}, file bytes: {}", got.get(), bytes.get());
    engine.with_engine(|e| println!("engine: {:?}", e.stats()));
    println!("loop: {:?}", ctx.counters());
}
