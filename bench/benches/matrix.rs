//! `cargo bench -p aio-bench --bench matrix`: the quick scsi-disk matrix (every fd monitor and
//! engine this kernel offers; 1, 16 and 256 disks; rd and randrw; 1 s per cell), printed as
//! the table of the scsi-disk scaling test from the QEMU epoll discussion (1..256 disks on one
//! IOThread). The same as `cargo run --release -p aio-bench -- matrix`.

use aio_bench::matrix::{self, MatrixSpec};

fn main() {
    // `cargo bench` passes `--bench`; a filter argument other than that is not supported here.
    let spec = MatrixSpec::quick();
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
