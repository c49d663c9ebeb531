//! Reads a file with O_DIRECT through io_uring from an async task, 32 reads in flight at a
//! time with `join_all`, and prints the throughput. The same loop, the same engine, as the
//! callback examples: the task runs inside the `AioContext`.
//!
//! ```text
//! cargo run --release -p aio-backend-uring --example uring_async_read [-- PATH]
//! ```
//! Without a path it reads a 64 MiB file it creates (and removes) in the system temp dir.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_backend_uring::UringEngine;
use aio_core::engine::{AlignedBuf, IoFile};
use aio_loop::task::join_all;
use aio_loop::AioContext;

const BS: usize = 64 * 1024;
const DEPTH: u64 = 32;

fn main() -> std::io::Result<()> {
    let mut tmp;
    let path = match std::env::args().nth(1) {
        Some(p) => PathBuf::from(p),
        None => {
            tmp = tempfile::NamedTempFile::new()?;
            tmp.write_all(&vec![0x42; 64 << 20])?;
            tmp.path().to_path_buf()
        }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)?;
    let blocks = f.metadata()?.len() / BS as u64;
    let file = IoFile::from(f);

    let ctx = AioContext::new(EpollLoop::new()?)?;
    let engine = ctx.attach_engine(UringEngine::new(Default::default())?, |_, _| {})?;
    let start = Instant::now();
    let task = ctx.spawn(async move {
        let mut bytes = 0u64;
        let mut next = 0;
        while next < blocks {
            let end = (next + DEPTH).min(blocks);
            // DEPTH reads in flight; each buffer comes back with its result.
            let reads = (next..end).map(|b| engine.read(&file, b * BS as u64, AlignedBuf::new(BS)));
            for (result, _buf) in join_all(reads).await {
                bytes += result? as u64;
            }
            next = end;
        }
        Ok::<u64, std::io::Error>(bytes)
    });
    let bytes = ctx.block_on(task).map_err(std::io::Error::from)??;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read {} MiB in {secs:.3} s ({:.0} MiB/s, {blocks} reads of {} KiB, {DEPTH} at a time)",
        bytes >> 20,
        bytes as f64 / (1 << 20) as f64 / secs,
        BS / 1024
    );
    println!(
        "task polls: {}, loop: {:?}",
        ctx.task_polls(),
        ctx.counters()
    );
    Ok(())
}
