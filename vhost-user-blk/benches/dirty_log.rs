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
//! Run: `cargo bench -p aio-vhost-user-blk --bench dirty_log` (then
//! `python3 scripts/criterion_ratios.py`: `dirty log on / off`).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use aio::poll::PollLoop;
use aio::pool::{PoolConfig, ThreadPool};
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

/// One queue served on `ctx` and its driver; the log `on` or off.
struct Bench {
    ctx: AioContext<PollLoop>,
    queue: Option<VirtioBlkQueue<PollLoop, ThreadPool>>,
    driver: SplitRingDriver,
    len: u32,
    _log: Option<File>,
}

impl Bench {
    fn new(len: u32, on: bool) -> Bench {
        let device = Arc::new(BlockDevice::null(1 << 30, DiskOptions::default()).unwrap());
        let ctx = AioContext::new(PollLoop::new()).unwrap();
        let engine = ctx
            .attach_engine(ThreadPool::new(PoolConfig::default()).unwrap(), |_, _| {})
            .unwrap();
        let (driver, side) = SplitRingDriver::new(QUEUE, BATCH, len).unwrap();
        let mut setup =
            QueueSetup::new(device, side.queue, side.memory, side.kick, Some(side.call));
        let mut log_file = None;
        if on {
            let bytes = SplitRingDriver::memory_bytes(QUEUE, BATCH, len, 0).unwrap() / 4096 / 8 + 1;
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
            _log: log_file,
        }
    }

    /// Posts a batch of reads, kicks, and takes every completion.
    fn batch(&mut self) {
        for slot in 0..BATCH {
            let read = DriverRequest {
                kind: spec::T_IN,
                sector: u64::from(slot) * 128,
                len: self.len,
            };
            self.driver.post(slot, read).unwrap();
        }
        self.driver.notify().unwrap();
        let mut done = Vec::with_capacity(usize::from(BATCH));
        while done.len() < usize::from(BATCH) {
            self.ctx.poll(true);
            self.driver.take_used(&mut done).unwrap();
        }
        let _ = self.driver.clear_interrupt();
        assert!(done.iter().all(|f| f.status == spec::S_OK));
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            q.stop(&self.ctx);
        }
    }
}

fn dirty_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("dirty_log");
    group.throughput(Throughput::Elements(u64::from(BATCH)));
    for (size, len) in [("4k", 4096u32), ("64k", 64 << 10)] {
        for on in [false, true] {
            let mut bench = Bench::new(len, on);
            let id = BenchmarkId::new(if on { "on" } else { "off" }, size);
            group.bench_function(id, |b| b.iter(|| bench.batch()));
        }
    }
    group.finish();
}

criterion_group!(benches, dirty_log);
criterion_main!(benches);
