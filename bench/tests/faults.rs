//! The bench under injected faults: a matrix cell whose engine fails requests keeps running and
//! reports the failures; one whose engine loses writes is caught by `--verify`, on the
//! guest-memory path and on the copy path alike.

use std::time::Duration;

use aio_bench::load::Pattern;
use aio_bench::scsi::{run_cell, CellResult, CellSpec, MemoryPath};
use aio_bench::targets::image::DiskImage;
use aio_conformance::faults::{FaultPlan, FaultyEngine};
use aio_core::engine::IoEngine;

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
        // Every 5th write, from an `AlignedBuf` or from guest memory, acknowledged undone.
        let plan = FaultPlan {
            lose_write_every: Some(5),
            ..FaultPlan::default()
        };
        let engine = FaultyEngine::new(pool(), plan).unwrap();
        let stats = engine.stats_handle();
        let r = cell(&format!("lose-{memory}"), memory, engine);
        assert!(stats.get().lost_writes > 0, "{memory}: no write was lost");
        assert_eq!(r.errors, 0, "{memory}: a lost write looks like a success");
        assert!(r.verify_errors > 0, "{memory}: verify notices: {r:?}");
        assert!(
            r.verify_reports[0].contains("disk ") && r.verify_reports[0].contains("offset "),
            "{memory}: {:?}",
            r.verify_reports
        );
    }
}
