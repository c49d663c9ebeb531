//! io_uring for both jobs: the loop's fd monitor is `UringLoop` (POLL_ADD) and block I/O goes
//! through `UringEngine`; the probe says what the kernel offers first.
//!
//! ```text
//! cargo run --release -p aio-backend-uring --example uring_echo_and_read
//! ```

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::rc::Rc;

use aio_backend_uring::{probe, UringConfig, UringEngine, UringLoop};
use aio_core::engine::{AlignedBuf, IoFile, Request};
use aio_loop::{AioContext, FdHandler};

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

    // A socket watched through IORING_OP_POLL_ADD.
    let (reader, writer) = UnixStream::pair().expect("socketpair");
    reader.set_nonblocking(true).expect("non-blocking");
    let got = Rc::new(Cell::new(0usize));
    let g = got.clone();
    let reader = Rc::new(reader);
    let r = reader.clone();
    ctx.set_fd_handler(
        &*reader,
        FdHandler::new().on_read(move |_| {
            let mut buf = [0u8; 64];
            // Non-blocking: WouldBlock when a nested wake-up found it drained already.
            if let Ok(n) = (&*r).read(&mut buf) {
                g.set(g.get() + n);
            }
        }),
    )
    .expect("handler");

    // Block I/O through the io_uring engine.
    let mut image = tempfile::NamedTempFile::new().expect("temp file");
    image.write_all(&[0x77; 1 << 20]).expect("write");
    let file = IoFile::from(File::open(image.path()).expect("open"));
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
    (&writer).write_all(&[1]).expect("write");
    (&writer).write_all(&[1]).expect("write");

    while bytes.get() < 1 << 20 || got.get() < 2 {
        ctx.poll(true);
    }
    println!("pipe bytes: {}, file bytes: {}", got.get(), bytes.get());
    engine.with_engine(|e| println!("engine: {:?}", e.stats()));
    println!("loop: {:?}", ctx.counters());
}
