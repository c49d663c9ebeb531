//! `cargo bench -p aio-bench --bench matrix`: the quick scsi-disk matrix (every fd monitor and
//! engine this kernel offers; 1, 16 and 256 disks; rd and randrw; 1 s per cell), printed as
//! seed 003's table. The same as `cargo run --release -p aio-bench -- matrix`.

use std::time::Duration;

use aio_bench::engines::EngineKind;
use aio_bench::job::Pattern;
use aio_bench::matrix::{self, MatrixSpec, Workload};
use aio_bench::monitors::MonitorKind;
use aio_bench::scsi::CellSpec;

fn main() {
    // `cargo bench` passes `--bench`; a filter argument other than that is not supported here.
    let spec = MatrixSpec {
        fdmons: MonitorKind::ALL
            .into_iter()
            .filter(|k| k.build().is_ok())
            .collect(),
        engines: EngineKind::ALL
            .into_iter()
            .filter(|k| k.build().is_ok())
            .collect(),
        disks: vec![1, 16, 256],
        workloads: vec![Workload::Rd, Workload::RandRw],
        active_all: false,
        cell: CellSpec {
            disks: 1,
            active: 1,
            pattern: Pattern::Read,
            bs: 4096,
            iodepth: 8,
            runtime: Duration::from_secs(1),
            ramp: Duration::from_millis(200),
            poll_max_ns: 32_768,
            poll_idle: Duration::from_millis(100),
            verify: false,
        },
        disk_size: 64 << 20,
    };
    let dir = std::env::temp_dir().join(format!("aio-bench-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("image directory");
    let result = matrix::run(&spec, &dir, |i, n, c| {
        eprintln!(
            "[{i}/{n}] {} {} disks={} {}: {:.1} MB/s",
            c.engine,
            c.fdmon,
            c.disks,
            c.workload.name(),
            c.mb_s()
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(cells) => print!("{}", matrix::table(&spec, &cells)),
        Err(e) => {
            eprintln!("matrix: {e}");
            std::process::exit(1);
        }
    }
}
