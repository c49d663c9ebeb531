//! Discard and write-zeroes through each engine at QD 32, next to the same `fallocate` calls
//! made synchronously in a loop on one thread, in one criterion run.
//!
//! One iteration is a round over a 64 MiB file in the temp dir: 512 discards of 64 KiB (each
//! `fallocate(PUNCH_HOLE | KEEP_SIZE)`), then 512 write-zeroes of 64 KiB without unmap (each
//! `fallocate(ZERO_RANGE | KEEP_SIZE)`, which allocates the blocks again as unwritten extents
//! on ext4), so every round finds the file as the last one left it:
//!
//! * `range_ops/sync`: the 1024 calls, one after the other;
//! * `range_ops/<engine>`: the same 1024 requests through the engine, 32 in flight: `uring`
//!   (`IORING_OP_FALLOCATE`), `uring-1-worker` (with `UringConfig::io_workers` at 1), `pool`
//!   (its workers), `linux-aio` (behind `WithFallback` with a pool: the kernel's AIO has no
//!   `fallocate`).
//!
//! `range_ops_4_files/...` is the same with the ranges round-robin over four files (a VMM's
//! four disks), where the calls no longer wait for one file's lock.
//!
//! Run: `cargo bench -p aio-bench --bench range_ops` (then `python3 scripts/criterion_ratios.py`);
//! the temp dir must support `ZERO_RANGE` (ext4, xfs; not tmpfs).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::collections::VecDeque;
use std::os::fd::AsRawFd;

use aio_backend_linux_aio::LinuxAio;
use aio_backend_uring::{UringConfig, UringEngine};
use aio_core::engine::{IoEngine, IoFile, Request, WithFallback};
use aio_pool::ThreadPool;
use criterion::{criterion_group, criterion_main, Criterion};

const RANGE: u64 = 64 << 10;
const RANGES: u64 = 512;
const DEPTH: usize = 32;

/// The requests of one round, in order, over `files` (range `i` on file `i % files.len()`).
fn round(files: &[IoFile]) -> impl Iterator<Item = Request> + '_ {
    let f = move |i: u64| &files[i as usize % files.len()];
    let discards = (0..RANGES).map(move |i| Request::discard(f(i), i * RANGE, RANGE, i));
    let zeroes =
        (0..RANGES).map(move |i| Request::write_zeroes(f(i), i * RANGE, RANGE, false, RANGES + i));
    discards.chain(zeroes)
}

/// Runs one round through `engine` with `DEPTH` requests in flight; every request must
/// succeed.
fn through_engine<E: IoEngine>(engine: &mut E, files: &[IoFile]) {
    let mut requests = round(files);
    let mut out = VecDeque::new();
    let mut in_flight = 0;
    let mut left = 2 * RANGES;
    while left > 0 {
        while in_flight < DEPTH {
            match requests.next() {
                Some(r) => {
                    engine.submit(r).expect("submit");
                    in_flight += 1;
                }
                None => break,
            }
        }
        if engine.poll_completions(&mut out) == 0 {
            // Wait on every notifier (behind `WithFallback`, the pool's too), as a loop would.
            let mut pfds: Vec<libc::pollfd> = engine
                .notifiers()
                .iter()
                .map(|n| libc::pollfd {
                    fd: n.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `pfds` is a valid array of pollfds for the duration of the call.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 100) };
            engine.clear_notifier();
            for n in engine.notifiers().iter().skip(1) {
                n.test_and_clear();
            }
        }
        for c in out.drain(..) {
            assert!(c.result.is_ok(), "range op {}: {:?}", c.token, c.result);
            in_flight -= 1;
            left -= 1;
        }
    }
}

/// The same round as plain `fallocate` calls on this thread.
fn synchronously(files: &[IoFile]) {
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let zero = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    for mode in [punch, zero] {
        for i in 0..RANGES {
            let fd = files[i as usize % files.len()].raw_fd();
            // SAFETY: fallocate on an fd the IoFile keeps open, with plain integers.
            let ret = unsafe { libc::fallocate(fd, mode, (i * RANGE) as i64, RANGE as i64) };
            assert_eq!(ret, 0, "fallocate: {}", std::io::Error::last_os_error());
        }
    }
}

/// A file of the round's size in the temp dir, unlinked at once (the fd keeps it; nothing is
/// left behind).
fn image(n: usize) -> IoFile {
    let path = std::env::temp_dir().join(format!("aio-bench-range-ops-{}-{n}", std::process::id()));
    let image = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("a file in the temp dir");
    std::fs::remove_file(&path).unwrap();
    image.set_len(RANGES * RANGE).unwrap();
    IoFile::from(image)
}

/// One group: the synchronous loop and every engine over `files`.
fn group(c: &mut Criterion, name: &str, files: &[IoFile]) {
    let mut g = c.benchmark_group(name);
    g.sample_size(20);
    g.bench_function("sync", |b| b.iter(|| synchronously(files)));
    let pool = || ThreadPool::new(Default::default()).expect("pool");
    for (name, workers) in [("uring", None), ("uring-1-worker", Some(1))] {
        match UringEngine::new(UringConfig::default().with_io_workers(workers)) {
            Ok(mut uring) => {
                g.bench_function(name, |b| b.iter(|| through_engine(&mut uring, files)));
            }
            Err(e) => println!("skipped: {name}: {e}"),
        }
    }
    let mut p = pool();
    g.bench_function("pool", |b| b.iter(|| through_engine(&mut p, files)));
    match LinuxAio::new(Default::default()) {
        Ok(aio) => {
            let mut routed = WithFallback::new(aio, pool());
            g.bench_function("linux-aio", |b| {
                b.iter(|| through_engine(&mut routed, files))
            });
        }
        Err(e) => println!("skipped: linux-aio: {e}"),
    }
    g.finish();
}

fn range_ops(c: &mut Criterion) {
    // One file, as the comparison: every call serialises on that file's lock.
    group(c, "range_ops", &[image(0)]);
    // Four files (four disks of a VMM), the ranges round-robin over them.
    let four: Vec<IoFile> = (1..=4).map(image).collect();
    group(c, "range_ops_4_files", &four);
}

criterion_group!(benches, range_ops);
criterion_main!(benches);
