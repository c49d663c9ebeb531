//! Pool benchmarks: the fixed cost of handing work to a thread pool, and QD1 reads through the
//! pool with and without adaptive polling (QEMU's thread-pool notifier/io_poll change took QD1
//! from 69.87 to 49.45 µs):
//!
//! * `roundtrip/pool_run` — offload a no-op closure and receive its result in the loop
//!   (`pool_run_poll_32768`: the loop busy-polls like an IOThread), next to
//!   `roundtrip/tokio_spawn_blocking` — the same round trip through tokio's blocking pool;
//! * `qd1_randread_4k_odirect/{sync_pread, pool_poll_0, pool_poll_32768,
//!   pool_spin50us_poll_0, pool_spin50us_poll_32768}` — QD1 4 KiB O_DIRECT random reads of a
//!   64 MiB file in the system temp dir: a plain `pread` loop, and the pool attached to a loop
//!   with adaptive polling off and at QEMU's IOThread default, with workers that sleep at once
//!   (QEMU) or spin 50 µs for the next request first.
//!
//! Run: `cargo bench -p aio-pool --bench pool` (device-bound on a disk-backed temp dir);
//! `TMPDIR=/dev/shm cargo bench -p aio-pool --bench pool` measures the CPU cost of the handoff
//! (tmpfs completes O_DIRECT synchronously). Read the figures as ratios within one run.
#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::cell::Cell;
use std::rc::Rc;

use aio_backend_epoll::EpollLoop;
use aio_conformance::engine::{Rng, TempFile};
use aio_core::engine::{AlignedBuf, Request};
use aio_loop::{AioContext, PollParams};
use aio_pool::{PoolConfig, PoolContext, ThreadPool};
use criterion::{criterion_group, criterion_main, Criterion};

const FILE_BLOCKS: u64 = 16 * 1024; // 64 MiB of 4 KiB blocks
const BLOCK: usize = 4096;

fn roundtrip(c: &mut Criterion) {
    let mut g = c.benchmark_group("roundtrip");
    for (name, poll_max_ns) in [("pool_run", 0u64), ("pool_run_poll_32768", 32_768)] {
        let ctx = AioContext::new(EpollLoop::new().unwrap()).unwrap();
        ctx.set_poll_params(PollParams::iothread().with_max_ns(poll_max_ns));
        let pool = ThreadPool::new(PoolConfig::default()).unwrap();
        let pool = PoolContext::attach(&ctx, pool, |_, _| {}).unwrap();
        let done = Rc::new(Cell::new(false));
        g.bench_function(name, |b| {
            b.iter(|| {
                done.set(false);
                let d = done.clone();
                pool.run(|| (), move |_, r| d.set(r.is_ok())).unwrap();
                while !done.get() {
                    ctx.poll(true);
                }
            })
        });
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    g.bench_function("tokio_spawn_blocking", |b| {
        b.iter(|| {
            rt.block_on(async { tokio::task::spawn_blocking(|| ()).await })
                .unwrap()
        })
    });
    g.finish();
}

fn qd1_randread(c: &mut Criterion) {
    let tmp = TempFile::with_len((FILE_BLOCKS as usize) * BLOCK, 0x33);
    let Ok(file) = tmp.open(libc::O_DIRECT) else {
        eprintln!(
            "skipped: O_DIRECT is not supported in {}",
            std::env::temp_dir().display()
        );
        return;
    };
    let mut g = c.benchmark_group("qd1_randread_4k_odirect");
    let mut rng = Rng::new(1);
    let mut sync_buf = AlignedBuf::new(BLOCK);
    g.bench_function("sync_pread", |b| {
        b.iter(|| {
            let off = (rng.next_u64() % FILE_BLOCKS) * BLOCK as u64;
            // SAFETY: `sync_buf` is a live, exclusively borrowed buffer of BLOCK bytes.
            let n = unsafe {
                libc::pread(
                    file.raw_fd(),
                    sync_buf.as_mut_ptr().cast(),
                    BLOCK,
                    off as libc::off_t,
                )
            };
            assert_eq!(n, BLOCK as isize);
        })
    });
    for (spin_us, poll_max_ns) in [(0u64, 0u64), (0, 32_768), (50, 0), (50, 32_768)] {
        let ctx = AioContext::new(EpollLoop::new().unwrap()).unwrap();
        ctx.set_poll_params(PollParams::iothread().with_max_ns(poll_max_ns));
        let back: Rc<Cell<Option<AlignedBuf>>> = Rc::default();
        let b2 = back.clone();
        let pool = ThreadPool::new(
            PoolConfig::default().with_spin(std::time::Duration::from_micros(spin_us)),
        )
        .unwrap();
        let pool = PoolContext::attach(&ctx, pool, move |_, c| {
            assert_eq!(c.result.unwrap(), BLOCK);
            b2.set(c.buf.into_one());
        })
        .unwrap();
        let mut buf = Some(AlignedBuf::new(BLOCK));
        let name = if spin_us == 0 {
            format!("pool_poll_{poll_max_ns}")
        } else {
            format!("pool_spin{spin_us}us_poll_{poll_max_ns}")
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let off = (rng.next_u64() % FILE_BLOCKS) * BLOCK as u64;
                pool.submit(Request::read(&file, off, buf.take().unwrap(), 0))
                    .unwrap();
                loop {
                    ctx.poll(true);
                    if let Some(b) = back.take() {
                        buf = Some(b);
                        break;
                    }
                }
            })
        });
        let c = ctx.counters();
        eprintln!(
            "spin {spin_us} us, poll_max_ns {poll_max_ns}: blocking waits {}, poll hits {}, delivered {}",
            c.blocking_waits,
            c.poll_hits,
            pool.delivered()
        );
    }
    g.finish();
    drop(tmp);
}

criterion_group!(benches, roundtrip, qd1_randread);
criterion_main!(benches);
