//! The bench under injected faults: a matrix cell whose engine fails requests keeps running and
//! reports the failures; one whose engine loses writes is caught by `--verify`, on the
//! guest-memory path and on the copy path alike.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use aio_bench::load::Pattern;
use aio_bench::scsi::{run_cell, CellResult, CellSpec, MemoryPath};
use aio_bench::targets::image::DiskImage;
use aio_conformance::faults::{FaultPlan, FaultyEngine};
use aio_core::engine::{Completion, IoEngine, Request, SubmitError};
use aio_core::Notifier;

/// Runs the fault cell with `engine` on fresh stamped images (`tag` keeps them apart).
fn cell(tag: &str, memory: MemoryPath, engine: impl IoEngine + 'static) -> CellResult {
    let dir = std::env::temp_dir().join(format!("aio-bench-faults-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let images: Vec<DiskImage> = (0..4)
        .map(|i| DiskImage::create_stamped(dir.join(format!("d{i}")), 1 << 20, 4096).unwrap())
        .collect();
    // The quick matrix's cell (4 KiB blocks at iodepth 8), on four disks, two driven.
    let spec = CellSpec {
        disks: 4,
        active: 2,
        pattern: Pattern::RandReadWrite,
        runtime: Duration::from_millis(300),
        ramp: Duration::ZERO,
        poll_idle: Duration::from_millis(50),
        verify: true,
        memory,
        ..CellSpec::quick()
    };
    let r = run_cell(aio_backend_poll::PollLoop::new(), engine, &images, spec).unwrap();
    drop(images);
    std::fs::remove_dir(&dir).unwrap();
    r
}

fn pool() -> aio_pool::ThreadPool {
    aio_pool::ThreadPool::new(aio_pool::PoolConfig::default()).unwrap()
}

#[test]
fn a_cell_survives_failed_requests_and_reports_them() {
    for memory in MemoryPath::ALL {
        let plan = FaultPlan {
            fail_every: Some((13, libc::EIO)),
            delay: Duration::from_micros(100),
            reorder: true,
            ..FaultPlan::default()
        };
        let faulty = FaultyEngine::new(pool(), plan).unwrap();
        let stats = faulty.stats_handle();
        let r = cell(&format!("fail-{memory}"), memory, faulty);
        let stats = stats.get();
        assert!(
            stats.failed > 0 && stats.forwarded > 0,
            "{memory}: {stats:?}"
        );
        assert!(
            r.errors > 0,
            "{memory}: injected failures are reported: {r:?}"
        );
        assert!(
            r.errors <= stats.failed,
            "{memory}: no error beyond those injected"
        );
        assert!(
            r.ios > 10 * r.errors,
            "{memory}: the rest keeps going: {r:?}"
        );
        assert_eq!(r.verify_errors, 0, "{memory}: {:?}", r.verify_reports);
        assert!(r.verified_reads > 0, "{memory}");
    }
}

#[test]
fn verify_catches_lost_writes_and_names_their_offsets() {
    for memory in MemoryPath::ALL {
        let engine = LoseWrites::new(pool(), 5);
        let lost = engine.lost.clone();
        let r = cell(&format!("lose-{memory}"), memory, engine);
        assert!(lost.get() > 0, "{memory}: no write was lost");
        assert_eq!(r.errors, 0, "{memory}: a lost write looks like a success");
        assert!(r.verify_errors > 0, "{memory}: verify notices: {r:?}");
        assert!(
            r.verify_reports[0].contains("disk ") && r.verify_reports[0].contains("offset "),
            "{memory}: {:?}",
            r.verify_reports
        );
    }
}

/// An engine that reports every `every`-th write of any kind (from an `AlignedBuf` or from
/// guest memory) as done without sending it: a lost write.
struct LoseWrites<E> {
    inner: E,
    every: u64,
    writes: u64,
    lost: Rc<Cell<u64>>,
    held: VecDeque<Completion>,
}

impl<E: IoEngine> LoseWrites<E> {
    fn new(inner: E, every: u64) -> Self {
        LoseWrites {
            inner,
            every,
            writes: 0,
            lost: Rc::default(),
            held: VecDeque::new(),
        }
    }
}

impl<E: IoEngine> IoEngine for LoseWrites<E> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn submit(&mut self, request: Request) -> Result<(), SubmitError> {
        if request.op.is_write() {
            self.writes += 1;
            if self.writes % self.every == 0 {
                self.lost.set(self.lost.get() + 1);
                let len = request.op.len();
                self.held.push_back(request.complete(Ok(len)));
                let _ = self.inner.notifier().notify();
                return Ok(());
            }
        }
        self.inner.submit(request)
    }
    fn plug(&mut self) {
        self.inner.plug()
    }
    fn unplug(&mut self) {
        self.inner.unplug()
    }
    fn set_max_batch(&mut self, max: usize) {
        self.inner.set_max_batch(max)
    }
    fn poll_completions(&mut self, out: &mut VecDeque<Completion>) -> usize {
        let n = self.held.len();
        out.extend(self.held.drain(..));
        n + self.inner.poll_completions(out)
    }
    fn has_completions(&self) -> bool {
        !self.held.is_empty() || self.inner.has_completions()
    }
    fn notifier(&self) -> &Notifier {
        self.inner.notifier()
    }
    fn cancel(&mut self, token: u64) -> bool {
        self.inner.cancel(token)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held.len()
    }
    fn drain(&mut self) -> Vec<Completion> {
        let mut all: Vec<Completion> = self.held.drain(..).collect();
        all.extend(self.inner.drain());
        all
    }
}
