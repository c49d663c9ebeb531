//! Two iothreads, each with its own loop and its own engine (a thread pool here), and four
//! "vCPU" threads that hand them block requests through their handles, as a VMM maps disks onto
//! iothreads (QEMU's iothread-vq-mapping: disk `d` on iothread `d % 2`). Each request runs as an
//! engine future on the iothread; the vCPU waits for its result with `call`.
//!
//! ```text
//! cargo run --release -p aio-loop --example iothreads
//! ```
//! It works on a file it creates (and removes) in the system temp dir.

use std::io::Write;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_core::engine::{AlignedBuf, IoFile};
use aio_loop::task::join_all;
use aio_loop::AttachedEngine;
use aio_loop::{AioContext, IoThread, PollParams};
use aio_pool::ThreadPool;

type Engine = AttachedEngine<EpollLoop, ThreadPool>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut image = tempfile::NamedTempFile::new()?;
    image.write_all(&vec![7u8; 8 << 20])?;
    let file = IoFile::from(image.reopen()?);

    // Each iothread builds its context and engine on its own thread.
    let iothreads: Vec<IoThread<EpollLoop, Engine>> = (0..2)
        .map(|i| {
            IoThread::spawn(&format!("iothread{i}"), || {
                let ctx = AioContext::new(EpollLoop::new()?)?;
                ctx.set_poll_params(PollParams::iothread());
                let engine = ctx.attach_engine(ThreadPool::new(Default::default())?, |_, _| {})?;
                Ok::<_, Box<dyn std::error::Error>>((ctx, engine))
            })
        })
        .collect::<Result<_, _>>()?;

    let start = Instant::now();
    let vcpus: Vec<_> = (0..4u64)
        .map(|disk| {
            let (iothread, file) = (iothreads[disk as usize % 2].handle(), file.clone());
            std::thread::spawn(move || {
                let mut bytes = 0;
                for round in 0..64u64 {
                    let f = file.clone();
                    // 8 reads of 4 KiB in flight, on the iothread, as one engine future each.
                    bytes += iothread
                        .call(move |ctx, engine: &Engine| {
                            let reads = (0..8).map(|i| {
                                let offset = ((disk * 64 + round) * 8 + i) % 2048 * 4096;
                                engine.read(&f, offset, AlignedBuf::new(4096))
                            });
                            let done = ctx.block_on(join_all(reads));
                            done.into_iter().map(|(r, _)| r.unwrap_or(0)).sum::<usize>()
                        })
                        .expect("the iothread runs");
                }
                bytes
            })
        })
        .collect();
    let bytes: usize = vcpus.into_iter().map(|t| t.join().expect("vcpu")).sum();
    println!(
        "4 vCPUs read {} KiB through 2 iothreads in {:.1} ms",
        bytes / 1024,
        start.elapsed().as_secs_f64() * 1e3
    );
    for t in &iothreads {
        let c = t.counters()?;
        println!(
            "{}: {} iterations, {} blocking waits",
            t.name(),
            c.iterations,
            c.blocking_waits
        );
    }
    for t in iothreads {
        t.stop()?;
    }
    Ok(())
}
