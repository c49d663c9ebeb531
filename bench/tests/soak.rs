//! The soak run (ignored by default; about 10 minutes):
//!
//! ```sh
//! cargo test --release -p aio-bench --test soak -- --ignored --nocapture
//! AIO_SOAK_SECS=60 cargo test --release -p aio-bench --test soak -- --ignored --nocapture
//! ```
//!
//! The matrix with `--verify` at 256 disks, all active, randrw, every fd monitor and engine this
//! kernel offers, on one iothread and on two (`--iothreads 1,2`: the disks spread round-robin
//! over two loops), for `AIO_SOAK_SECS` seconds (default 600) in all: zero verify errors, zero
//! failed or abandoned requests, and the open fds and RSS at the end equal those at the start:
//! fds exactly; RSS within 64 MiB of the start (the first cell fills the allocator's per-thread
//! caches of 256 guest threads) and within 16 MiB of its level after the first cell.

use std::time::{Duration, Instant};

use aio_bench::matrix::{self, MatrixSpec, Workload};
use aio_test_support::procfs::Proc;

#[test]
#[ignore = "a 10-minute soak; run it with --ignored (command in the README)"]
fn soak_256_disks_all_active_with_verify() {
    let secs: u64 = std::env::var("AIO_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let mut spec = MatrixSpec::quick();
    spec.disks = vec![256];
    spec.workloads = vec![Workload::RandRw];
    spec.active_all = true;
    spec.iothreads = vec![1, 2];
    spec.disk_size = 4 << 20;
    spec.cell.verify = true;
    spec.cell.ramp = Duration::ZERO;
    let cells = spec.cell_count() as u64;
    spec.cell.runtime = Duration::from_secs((secs / cells).max(1));
    let dir = std::env::temp_dir().join(format!("aio-bench-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    aio::process::raise_fd_limit();
    let me = Proc::current();
    let (fds0, rss0) = (me.fd_count(), me.rss_kib());
    let start = Instant::now();
    let mut rss_warm = 0;
    let result = matrix::run(&spec, &dir, |i, n, c| {
        if i == 1 {
            rss_warm = me.rss_kib();
        }
        eprintln!(
            "[{i}/{n}] {} {} K={}: {:.1} MB/s, {} reads verified, {} verify errors, {} errors",
            c.engine,
            c.fdmon,
            c.iothreads,
            c.mb_s(),
            c.result.verified_reads,
            c.result.verify_errors,
            c.result.errors
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
    let cells = result.unwrap();
    let (fds1, rss1) = (me.fd_count(), me.rss_kib());
    let ios: u64 = cells.iter().map(|c| c.result.ios).sum();
    let verified: u64 = cells.iter().map(|c| c.result.verified_reads).sum();
    let verify_errors: u64 = cells.iter().map(|c| c.result.verify_errors).sum();
    let errors: u64 = cells.iter().map(|c| c.result.errors).sum();
    eprintln!(
        "soak: {:?}, {} cells, {ios} requests, {verified} reads verified, {verify_errors} verify errors, {errors} errors; fds {fds0} -> {fds1}, RSS {rss0} KiB -> {rss_warm} KiB after the first cell -> {rss1} KiB",
        start.elapsed(),
        cells.len()
    );
    assert_eq!(verify_errors, 0);
    assert_eq!(errors, 0, "failed or abandoned requests");
    assert!(ios > 0 && verified > 0);
    assert_eq!(fds1, fds0, "open fds at the end equal the start");
    assert!(
        rss1 <= rss0 + 64 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB"
    );
    assert!(
        rss1 <= rss_warm + 16 * 1024,
        "RSS grew from {rss_warm} KiB after the first cell to {rss1} KiB"
    );
}
