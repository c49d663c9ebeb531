//! Reads a file with O_DIRECT through Linux AIO attached to a loop, 32 requests in flight, each
//! completion submitting the next read from its own callback, and prints what the engine did
//! (no io_getevents syscalls: completions come from the ring).
//!
//! ```text
//! cargo run --release -p aio-backend-linux-aio --example aio_read [-- PATH]
//! ```
//! Without a path it writes 64 MiB of numbered blocks to a temporary file (removed at the end),
//! reads them back and checks that every block holds its number.

use std::cell::Cell;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_backend_linux_aio::{LinuxAio, LinuxAioConfig};
use aio_core::engine::{AlignedBuf, IoFile, Request, SubmitError};
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;

const BS: usize = 64 * 1024;
const DEPTH: u64 = 32;

fn main() -> std::io::Result<()> {
    // The file to read, or numbered blocks in a scratch file (each block filled with the low
    // byte of its number).
    let scratch = tempfile::NamedTempFile::new()?;
    let path = std::env::args().nth(1).map(PathBuf::from);
    let verify = path.is_none();
    if verify {
        let mut out = scratch.as_file();
        for block in 0..(64 << 20) / BS {
            out.write_all(&[block as u8; BS])?;
        }
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path.as_deref().unwrap_or(scratch.path()))?;
    let size = f.metadata()?.len();
    let file = IoFile::from(f);
    let blocks = size / BS as u64;

    let ctx = AioContext::new(EpollLoop::new()?)?;
    // Every request here has its own completion callback: the engine-wide one sees nothing.
    let engine = ctx.attach_engine(LinuxAio::new(LinuxAioConfig::default())?, |_, _| {})?;
    let progress = Rc::new(Progress {
        file,
        blocks,
        verify,
        wrong_blocks: Cell::new(0),
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
    if verify {
        println!(
            "blocks holding the wrong number: {}",
            progress.wrong_blocks.get()
        );
    }
    engine.with_engine(|e| println!("engine: {:?}", e.stats()));
    println!("loop:   {:?}", ctx.counters());
    Ok(())
}

/// What the reads share: the file, the next block to read, and what finished.
struct Progress {
    file: IoFile,
    blocks: u64,
    /// Check each block's number (the scratch file's contents).
    verify: bool,
    wrong_blocks: Cell<u64>,
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
        let buf = c.buf.into_one().expect("a read's buffer");
        if p.verify && buf.iter().any(|&b| b != block as u8) {
            p.wrong_blocks.set(p.wrong_blocks.get() + 1);
        }
        if p.next.get() < p.blocks {
            read_next(engine, &p, buf).expect("submit");
        }
    })?;
    Ok(())
}
