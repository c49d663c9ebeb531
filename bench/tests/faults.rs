//! The bench under injected faults: a matrix cell whose engine fails requests keeps running and
//! reports the failures; one whose engine loses writes is caught by `--verify`.

use std::time::Duration;

use aio_bench::image::DiskImage;
use aio_bench::job::Pattern;
use aio_bench::scsi::{run_cell, CellResult, CellSpec};
use aio_core::testing::faults::{FaultPlan, FaultyEngine};

fn cell(plan: FaultPlan) -> (CellResult, aio_core::testing::faults::FaultStats) {
    let dir = std::env::temp_dir().join(format!(
        "aio-bench-faults-{}-{}",
        std::process::id(),
        plan.lose_write_every.is_some()
    ));
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
        ..CellSpec::quick()
    };
    let engine = aio_pool::ThreadPool::new(aio_pool::PoolConfig::default()).unwrap();
    let faulty = FaultyEngine::new(engine, plan).unwrap();
    let stats = faulty.stats_handle();
    let r = run_cell(aio_backend_poll::PollLoop::new(), faulty, &images, spec).unwrap();
    drop(images);
    std::fs::remove_dir(&dir).unwrap();
    (r, stats.get())
}

#[test]
fn a_cell_survives_failed_requests_and_reports_them() {
    let (r, stats) = cell(FaultPlan {
        fail_every: Some((13, libc::EIO)),
        delay: Duration::from_micros(100),
        reorder: true,
        ..FaultPlan::default()
    });
    assert!(stats.failed > 0 && stats.forwarded > 0, "{stats:?}");
    assert!(r.errors > 0, "injected failures are reported: {r:?}");
    assert!(r.errors <= stats.failed, "no error beyond those injected");
    assert!(r.ios > 10 * r.errors, "the rest keeps going: {r:?}");
    assert_eq!(r.verify_errors, 0, "{:?}", r.verify_reports);
    assert!(r.verified_reads > 0);
}

#[test]
fn verify_catches_lost_writes_and_names_their_offsets() {
    let (r, stats) = cell(FaultPlan {
        lose_write_every: Some(5),
        ..FaultPlan::default()
    });
    assert!(stats.lost_writes > 0, "{stats:?}");
    assert_eq!(r.errors, 0, "a lost write looks like a success");
    assert!(r.verify_errors > 0, "verify notices: {r:?}");
    assert!(
        r.verify_reports[0].contains("disk ") && r.verify_reports[0].contains("offset "),
        "{:?}",
        r.verify_reports
    );
}
