//! The pool attached to a loop: a batch of reads from a file (QEMU's aio=threads) and a
//! blocking computation offloaded to a pool thread, both completing in the loop.
//!
//! ```text
//! cargo run -p aio-pool --example offload
//! ```

use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::rc::Rc;

use aio_backend_epoll::EpollLoop;
use aio_core::engine::{AlignedBuf, IoFile, Request};
use aio_loop::AioContext;
use aio_pool::{PoolConfig, PoolContext, ThreadPool};

fn main() {
    let ctx = AioContext::new(EpollLoop::new().expect("epoll")).expect("context");
    let pool = ThreadPool::new(PoolConfig::default()).expect("pool");
    let bytes = Rc::new(Cell::new(0usize));
    let reads = Rc::new(Cell::new(0usize));
    let (b, r) = (bytes.clone(), reads.clone());
    let pool = PoolContext::attach(&ctx, pool, move |_ctx, completion| {
        let n = completion.result.expect("read");
        b.set(b.get() + n);
        r.set(r.get() + 1);
    })
    .expect("attach");

    // 1. Sixteen 64 KiB reads of a 1 MiB file, sent as one batch.
    let mut image = tempfile::NamedTempFile::new().expect("temp file");
    image.write_all(&[0xab; 1 << 20]).expect("write");
    let file = IoFile::from(File::open(image.path()).expect("open"));
    pool.plug();
    for i in 0..16u64 {
        let req = Request::read(&file, i * 65536, AlignedBuf::new(65536), i);
        pool.submit(req).expect("submit");
    }
    pool.unplug();

    // 2. A blocking computation whose typed result comes back in the loop.
    let sum = Rc::new(Cell::new(None));
    let s = sum.clone();
    pool.run(
        || (1..=1_000_000u64).sum::<u64>(),
        move |_ctx, v| s.set(Some(v.expect("work"))),
    )
    .expect("run");

    while reads.get() < 16 || sum.get().is_none() {
        ctx.poll(true);
    }
    println!("read {} bytes in {} requests", bytes.get(), reads.get());
    println!("sum 1..=1e6 = {}", sum.get().unwrap());
    println!("pool: {:?}", pool.with_pool(|p| p.stats()));
    println!("loop: {:?}", ctx.counters());
}
