//! Reads a file with O_DIRECT through Linux AIO attached to a loop, 32 requests in flight, and
//! prints what the engine did (no io_getevents syscalls: completions come from the ring).
//!
//! ```text
//! cargo run --release -p aio-backend-linux-aio --example aio_read [-- PATH]
//! ```
//! Without a path it reads a 64 MiB file it creates (and removes) in the system temp dir.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_backend_linux_aio::{LinuxAio, LinuxAioConfig};
use aio_core::engine::{AlignedBuf, IoFile, Request};
use aio_core::AioContext;

const BS: usize = 64 * 1024;
const DEPTH: u64 = 32;

fn main() -> std::io::Result<()> {
    let mut tmp;
    let path = match std::env::args().nth(1) {
        Some(p) => PathBuf::from(p),
        None => {
            // 64 MiB of data in a temporary file, removed when `tmp` is dropped.
            tmp = tempfile::NamedTempFile::new()?;
            tmp.write_all(&vec![0x42; 64 << 20])?;
            tmp.path().to_path_buf()
        }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)?;
    let size = f.metadata()?.len();
    let file = IoFile::from(f);
    let blocks = size / BS as u64;

    let ctx = AioContext::new(EpollLoop::new()?)?;
    let engine = LinuxAio::new(LinuxAioConfig::default())?;
    let bytes = Rc::new(Cell::new(0u64));
    let finished = Rc::new(Cell::new(0u64));
    let next = Rc::new(Cell::new(0u64));
    let (b, fin, nx, file2) = (bytes.clone(), finished.clone(), next.clone(), file.clone());
    let requeue: Rc<RefCell<Vec<Request>>> = Rc::default();
    let rq = requeue.clone();
    let engine = ctx.attach_engine(engine, move |_ctx, c| {
        b.set(b.get() + c.result.expect("read") as u64);
        fin.set(fin.get() + 1);
        // Keep the queue full: reuse the buffer for the next block.
        if nx.get() < blocks {
            let buf = c.buf.into_one().unwrap();
            rq.borrow_mut()
                .push(Request::read(&file2, nx.get() * BS as u64, buf, nx.get()));
            nx.set(nx.get() + 1);
        }
    })?;
    let start = Instant::now();
    while next.get() < DEPTH.min(blocks) {
        engine.submit(Request::read(
            &file,
            next.get() * BS as u64,
            AlignedBuf::new(BS),
            next.get(),
        ))?;
        next.set(next.get() + 1);
    }
    while finished.get() < blocks {
        ctx.poll(true);
        // The callback cannot reach `engine` (it is created after it); submit here.
        // One io_submit for all of them (plug/unplug batching).
        engine.plug();
        for r in requeue.take() {
            engine.submit(r)?;
        }
        engine.unplug();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read {} MiB in {:.3} s ({:.0} MiB/s, {} requests of {} KiB, depth {DEPTH})",
        bytes.get() >> 20,
        secs,
        bytes.get() as f64 / (1 << 20) as f64 / secs,
        blocks,
        BS / 1024
    );
    engine.with_engine(|e| println!("engine: {:?}", e.stats()));
    println!("loop:   {:?}", ctx.counters());
    Ok(())
}
