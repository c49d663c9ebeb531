//! Runs one variant of the peers' job once on a file and prints what it measured.
//!
//! ```sh
//! cargo run --release -p aio-peers --example one_variant -- FILE [VARIANT] [QD]
//! ```
//!
//! FILE must exist and hold at least one 4 KiB block, written (for example
//! `dd if=/dev/urandom of=/var/tmp/test.img bs=1M count=64`: a file made with `fallocate`
//! alone reads as zeros without reaching the disk); it is read with O_DIRECT, so it must be on
//! a file system that supports it (not tmpfs). VARIANT defaults to `aio-uring-async`, QD to 32.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aio::{Choice, MonitorKind, Pairing};
use aio_peers::{Job, Variant};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next().map(PathBuf::from) else {
        eprintln!("usage: one_variant FILE [VARIANT] [QD]");
        return ExitCode::from(2);
    };
    let name = args.next().unwrap_or_else(|| "aio-uring-async".to_string());
    let Some(variant) = Variant::from_name(&name) else {
        let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
        eprintln!("unknown variant {name:?}; one of {}", names.join(", "));
        return ExitCode::from(2);
    };
    let qd = match args.next().map(|s| s.parse::<usize>()) {
        None => 32,
        Some(Ok(qd)) if qd > 0 => qd,
        Some(_) => {
            eprintln!("QD must be a whole number above 0");
            return ExitCode::from(2);
        }
    };
    let bs = 4096;
    let size = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let job = Job {
        path,
        blocks: size / bs as u64,
        bs,
        qd,
        ramp: Duration::from_millis(200),
        secs: Duration::from_secs(1),
        poll_max_ns: aio_loop::PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
        fdmon: Pairing::Apart(Choice::Named(MonitorKind::Epoll)),
        uring_registered: false,
    };
    if job.blocks == 0 {
        eprintln!("{}: smaller than one {bs}-byte block", job.path.display());
        return ExitCode::from(2);
    }
    match aio_peers::run(variant, &job) {
        Ok(s) => {
            println!(
                "{variant} QD {qd}: {:.0} IOPS, mean {:.1} µs, p99 {:.1} µs, \
                 {:.1} µs CPU per read, {} errors",
                s.iops(),
                s.mean_lat_us(),
                s.p99_us(),
                s.cpu_us_per_req(),
                s.errors
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{variant}: {e}");
            ExitCode::FAILURE
        }
    }
}
