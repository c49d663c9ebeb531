//! Reads a file through the thread pool from an async task and checksums every block on a
//! pool thread as well: `engine().read(..)` for the I/O (QEMU's aio=threads) and
//! `run_async` for the CPU work (tokio's `spawn_blocking`, on the loop). The pool runs
//! `preadv` on any file, so this one goes through the page cache, without `O_DIRECT`.
//!
//! ```text
//! cargo run --release -p aio-pool --example pool_async_read [-- PATH]
//! ```
//! Without a path it reads a 16 MiB file of numbered blocks, created unlinked in the system
//! temp dir.

use std::io::Write;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_core::engine::{AlignedBuf, IoFile};
use aio_loop::task::join_all;
use aio_loop::AioContext;
use aio_pool::{PoolConfig, PoolContext, ThreadPool};

const BLOCK: usize = 256 * 1024;
/// Reads in flight at a time, and checksums after them.
const DEPTH: u64 = 8;

fn main() -> std::io::Result<()> {
    let file = match std::env::args().nth(1) {
        Some(path) => std::fs::File::open(path)?,
        None => {
            let mut f = tempfile::tempfile()?;
            for block in 0..64u8 {
                f.write_all(&[block; BLOCK])?;
            }
            f
        }
    };
    let len = file.metadata()?.len();
    let file = IoFile::from(file);

    let ctx = AioContext::new(EpollLoop::new()?)?;
    let pool = ThreadPool::new(PoolConfig::default()).map_err(std::io::Error::from)?;
    // Every read here is a future with its own result: the engine-wide callback sees nothing.
    let pool = PoolContext::attach(&ctx, pool, |_, _| {})?;
    let start = Instant::now();
    let task = ctx.spawn(async move {
        let (mut bytes, mut sum) = (0u64, 0u64);
        let mut offset = 0;
        while offset < len {
            let offsets = (0..DEPTH)
                .map(|i| offset + i * BLOCK as u64)
                .take_while(|&o| o < len);
            let reads = offsets.map(|o| pool.engine().read(&file, o, AlignedBuf::new(BLOCK)));
            // The blocks just read are checksummed on pool threads, DEPTH at a time; each
            // buffer moves to its thread and is freed there.
            let mut checksums = Vec::new();
            for (result, buf) in join_all(reads).await {
                let n = result?;
                bytes += n as u64;
                checksums.push(pool.run_async(move || fnv1a(&buf[..n])));
            }
            for checksum in join_all(checksums).await {
                sum ^= checksum?;
            }
            offset += DEPTH * BLOCK as u64;
        }
        Ok::<_, std::io::Error>((bytes, sum))
    });
    let (bytes, sum) = ctx.block_on(task).map_err(std::io::Error::from)??;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read and checksummed {} MiB in {secs:.3} s ({:.0} MiB/s); xor of the blocks' FNV-1a: {sum:016x}",
        bytes >> 20,
        bytes as f64 / (1 << 20) as f64 / secs,
    );
    println!("loop: {:?}", ctx.counters());
    Ok(())
}

/// The 64-bit FNV-1a hash of `data`: CPU work worth moving off the loop thread.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
