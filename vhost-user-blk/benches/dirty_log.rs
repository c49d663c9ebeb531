//! What the dirty log costs the data path: one queue on a null disk (so that the device's
//! own path is all there is to measure), driven on this thread by the in-process split-ring
//! driver, with the log off and on.
//!
//! One iteration posts 64 reads, kicks, and takes the 64 completions (the null disk answers
//! inside the kick's handler): `dirty_log/off/<size>` with no tracking (what every queue pays
//! when no migration runs: one `Option` check per report), `dirty_log/on/<size>` with a
//! [`DirtyLog`] mapped from a memfd and the used ring logged (what a queue pays while a
//! migration runs: an atomic OR per byte of pages of each buffer, status byte, used element
//! and index). Sizes 4 KiB (one page a read) and 64 KiB (16 pages).
//!
//! `dirty_log_qd32/{off,on}/{randread,randwrite}`: the same queue over a 256 MiB raw file in
//! `/dev/shm` on io_uring, 32 random 4 KiB requests a batch (QD 32), reads and writes (a
//! write's data is read from guest memory, so only its status byte and the used ring are
//! logged).
//!
//! Run: `cargo bench -p aio-vhost-user-blk --bench dirty_log` (then
//! `python3 scripts/criterion_ratios.py`: `dirty log on / off`).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use aio::poll::PollLoop;
use aio::pool::{PoolConfig, ThreadPool};
use aio_core::engine::IoEngine;
use aio_loop::AioContext;
use aio_vhost_user_blk::log::DirtyLog;
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::dirty::DirtyTracking;
use aio_virtio_blk::driver::{DriverRequest, SplitRingDriver};
use aio_virtio_blk::queue::{QueueSetup, VirtioBlkQueue};
use aio_virtio_blk::spec;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const QUEUE: u16 = 256;
const BATCH: u16 = 64;
/// The raw file's size, and so the random requests' range.
const FILE_BYTES: u64 = 256 << 20;

/// A memfd of `size` bytes.
fn memfd(size: u64) -> File {
    // SAFETY: a NUL-terminated name and flags; the fd is checked, then owned by the `File`.
    let file = unsafe {
        let fd = libc::memfd_create(c"dirty-log-bench".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create");
        File::from_raw_fd(fd)
    };
    file.set_len(size).unwrap();
    file
}

/// One queue served on `ctx` with engine `E` and its driver; the log on or off.
struct Bench<E: IoEngine + 'static> {
    ctx: AioContext<PollLoop>,
    queue: Option<VirtioBlkQueue<PollLoop, E>>,
    driver: SplitRingDriver,
    len: u32,
    batch: u16,
    /// A small xorshift state: the random requests' sectors.
    seed: u64,
    _log: Option<File>,
}

impl<E: IoEngine + 'static> Bench<E> {
    /// `batch` requests of `len` bytes a batch on `device` through `engine`; the log `on` or
    /// off.
    fn new(device: BlockDevice, engine: E, (len, batch): (u32, u16), on: bool) -> Bench<E> {
        let ctx = AioContext::new(PollLoop::new()).unwrap();
        let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
        let (driver, side) = SplitRingDriver::new(QUEUE, batch, len).unwrap();
        let mut setup = QueueSetup::new(
            Arc::new(device),
            side.queue,
            side.memory,
            side.kick,
            Some(side.call),
        );
        let mut log_file = None;
        if on {
            let bytes = SplitRingDriver::memory_bytes(QUEUE, batch, len, 0).unwrap() / 4096 / 8 + 1;
            let file = memfd(bytes);
            let log = Arc::new(DirtyLog::map(&file, 0, bytes).unwrap());
            let used = driver.ring_addrs().2 .0;
            setup = setup.with_dirty_tracking(DirtyTracking::new(log, Some(used)));
            log_file = Some(file);
        }
        let queue = VirtioBlkQueue::start_with(&ctx, engine, setup).unwrap();
        Bench {
            ctx,
            queue: Some(queue),
            driver,
            len,
            batch,
            seed: 0x9e37_79b9_7f4a_7c15,
            _log: log_file,
        }
    }

    /// Posts a batch of `kind` requests (sequential for `sequential`, else random over the
    /// file), kicks, and takes every completion.
    fn batch(&mut self, kind: u32, sequential: bool) {
        let sectors = FILE_BYTES / 512 / u64::from(self.len / 512);
        for slot in 0..self.batch {
            let sector = if sequential {
                u64::from(slot) * 128
            } else {
                self.seed ^= self.seed << 13;
                self.seed ^= self.seed >> 7;
                self.seed ^= self.seed << 17;
                (self.seed % sectors) * u64::from(self.len / 512)
            };
            let request = DriverRequest {
                kind,
                sector,
                len: self.len,
            };
            self.driver.post(slot, request).unwrap();
        }
        self.driver.notify().unwrap();
        let mut done = Vec::with_capacity(usize::from(self.batch));
        while done.len() < usize::from(self.batch) {
            self.ctx.poll(true);
            self.driver.take_used(&mut done).unwrap();
        }
        let _ = self.driver.clear_interrupt();
        assert!(done.iter().all(|f| f.status == spec::S_OK));
    }
}

impl<E: IoEngine + 'static> Drop for Bench<E> {
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            q.stop(&self.ctx);
        }
    }
}

/// A thread pool engine with its defaults.
fn pool() -> ThreadPool {
    ThreadPool::new(PoolConfig::default()).unwrap()
}

fn dirty_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("dirty_log");
    group.throughput(Throughput::Elements(u64::from(BATCH)));
    for (size, len) in [("4k", 4096u32), ("64k", 64 << 10)] {
        for on in [false, true] {
            let device = BlockDevice::null(1 << 30, DiskOptions::default()).unwrap();
            let mut bench = Bench::new(device, pool(), (len, BATCH), on);
            let id = BenchmarkId::new(if on { "on" } else { "off" }, size);
            group.bench_function(id, |b| b.iter(|| bench.batch(spec::T_IN, true)));
        }
    }
    group.finish();
}

/// The raw file in `/dev/shm` at QD 32 on io_uring (the thread pool where this kernel has
/// no io_uring), random 4 KiB reads and writes.
fn dirty_log_qd32(c: &mut Criterion) {
    const DEPTH: u16 = 32;
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("disk.img");
    // Written whole first: tmpfs allocates a page at its first write, which would make the
    // first write run slower than the second.
    let chunk = vec![0xa5u8; 1 << 20];
    let mut file = File::create(&path).unwrap();
    for _ in 0..FILE_BYTES / (1 << 20) {
        std::io::Write::write_all(&mut file, &chunk).unwrap();
    }
    drop(file);
    let mut group = c.benchmark_group("dirty_log_qd32");
    group.throughput(Throughput::Elements(u64::from(DEPTH)));
    for (rw, kind) in [("randread", spec::T_IN), ("randwrite", spec::T_OUT)] {
        for on in [false, true] {
            let device = BlockDevice::open(&path, DiskOptions::default()).unwrap();
            let id = BenchmarkId::new(if on { "on" } else { "off" }, rw);
            match aio::uring::UringEngine::new(aio::uring::UringConfig::default()) {
                Ok(engine) => {
                    let mut bench = Bench::new(device, engine, (4096, DEPTH), on);
                    group.bench_function(id, |b| b.iter(|| bench.batch(kind, false)));
                }
                Err(e) => {
                    eprintln!("io_uring: {e}; the thread pool instead");
                    let mut bench = Bench::new(device, pool(), (4096, DEPTH), on);
                    group.bench_function(id, |b| b.iter(|| bench.batch(kind, false)));
                }
            }
        }
    }
    group.finish();
}

criterion_group!(benches, dirty_log, dirty_log_qd32);
criterion_main!(benches);
