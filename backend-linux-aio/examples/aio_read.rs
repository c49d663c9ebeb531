//! Reads a file with O_DIRECT through Linux AIO attached to a loop, 32 requests in flight, each
//! completion submitting the next read from its own callback, and prints what the engine did
//! (no io_getevents syscalls: completions come from the ring).
//!
//! ```text
//! cargo run --release -p aio-backend-linux-aio --example aio_read [-- PATH]
//! ```
//! Without a path it reads a 64 MiB file it creates (and removes) in the system temp dir.

use std::cell::Cell;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_backend_linux_aio::{LinuxAio, LinuxAioConfig};
use aio_core::engine::{AlignedBuf, AttachedEngine, IoFile, Request, SubmitError};
use aio_core::{AioContext, EventLoop};

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
    // Every request here has its own completion callback: the engine-wide one sees nothing.
    let engine = ctx.attach_engine(LinuxAio::new(LinuxAioConfig::default())?, |_, _| {})?;
    let progress = Rc::new(Progress {
        file,
        blocks,
        next: Cell::new(0),
        finished: Cell::new(0),
        bytes: Cell::new(0),
    });
    let start = Instant::now();
    // One io_submit for the first DEPTH requests (plug/unplug batching); after that each
    // completion submits the next block from its own callback, reusing its buffer.
    engine.plug();
    for _ in 0..DEPTH.min(blocks) {
        read_next(&engine, &progress, AlignedBuf::new(BS))?;
    }
    engine.unplug();
    while progress.finished.get() < blocks {
        ctx.poll(true);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read {} MiB in {:.3} s ({:.0} MiB/s, {} requests of {} KiB, depth {DEPTH})",
        progress.bytes.get() >> 20,
        secs,
        progress.bytes.get() as f64 / (1 << 20) as f64 / secs,
        blocks,
        BS / 1024
    );
    engine.with_engine(|e| println!("engine: {:?}", e.stats()));
    println!("loop:   {:?}", ctx.counters());
    Ok(())
}

/// What the reads share: the file, the next block to read, and what finished.
struct Progress {
    file: IoFile,
    blocks: u64,
    next: Cell<u64>,
    finished: Cell<u64>,
    bytes: Cell<u64>,
}

/// Submits a read of the next block into `buf`, whose callback counts it and submits the one
/// after (the batch the loop plugs around completions sends them together).
fn read_next<L: EventLoop + 'static>(
    engine: &AttachedEngine<L, LinuxAio>,
    progress: &Rc<Progress>,
    buf: AlignedBuf,
) -> Result<(), SubmitError> {
    let block = progress.next.get();
    progress.next.set(block + 1);
    let request = Request::read(&progress.file, block * BS as u64, buf, block);
    let p = progress.clone();
    engine.submit_with(request, move |_ctx, engine, c| {
        p.bytes.set(p.bytes.get() + c.result.expect("read") as u64);
        p.finished.set(p.finished.get() + 1);
        if p.next.get() < p.blocks {
            let buf = c.buf.into_one().expect("a read's buffer");
            read_next(engine, &p, buf).expect("submit");
        }
    })?;
    Ok(())
}
