//! `aio-bench latency`: QD1 latency per engine with the loop's polling off, at QEMU's IOThread
//! default and at the values given (the measurement of QEMU's thread-pool notifier/io_poll
//! change).
//!
//! This module owns the subcommand's run: the engines and polling limits compared, the test
//! target (a file, or the fast device) and the table, mean latency with p99 per cell. It never
//! measures anything itself ([`aio_bench::fio::job::run_job`]).

use std::time::Duration;

use aio_bench::backends::engines::{EngineKind, UringOptions};
use aio_bench::error::BenchError;
use aio_bench::fio::job::{run_job, JobSpec};
use aio_core::engine::IoFile;

use super::{check_target, test_image};
use crate::LatencyArgs;

/// The warm-up of each cell.
const RAMP: Duration = Duration::from_millis(300);

/// Runs `latency`.
pub fn run(mut args: LatencyArgs) -> Result<(), BenchError> {
    args.size = args.device.map_or(args.size, |d| d.size);
    let dir = check_target(args.dir.as_deref(), args.bs, args.size, "--size")?;
    let engines: Vec<EngineKind> = if args.engine.is_empty() {
        EngineKind::available()
    } else {
        args.engine.clone()
    };
    // Off and QEMU's IOThread default, then the values given.
    let mut polls = vec![0u64, 32_768];
    for &p in &args.poll_max_ns {
        if !polls.contains(&p) {
            polls.push(p);
        }
    }
    let (_device, image) = test_image(&dir, args.size, args.device)?;
    println!(
        "QD1 {} bs={} on {} ({} MiB, O_DIRECT), fd monitor {}, {:?} per cell: mean latency in µs (p99)",
        args.rw,
        args.bs,
        image.path().display(),
        args.size >> 20,
        args.fdmon,
        args.runtime
    );
    print!("{:<10}", "engine");
    for p in &polls {
        print!(" {:>22}", format!("poll_max_ns={p}"));
    }
    println!();
    for engine in engines {
        print!("{:<10}", engine.name());
        for &poll_max_ns in &polls {
            let cell = one_cell(&args, engine, poll_max_ns, image.file())?;
            print!(" {cell:>22}");
        }
        println!();
    }
    Ok(())
}

/// One cell at QD1: `mean (p99)` in µs.
fn one_cell(
    args: &LatencyArgs,
    engine: EngineKind,
    poll_max_ns: u64,
    file: &IoFile,
) -> Result<String, BenchError> {
    let spec = JobSpec {
        ramp: RAMP,
        poll_max_ns,
        ..JobSpec::new(args.rw, args.bs as usize, 1, args.runtime)
    };
    let monitor = args
        .fdmon
        .build()
        .map_err(|e| BenchError::io(args.fdmon.to_string(), e))?;
    let eng = engine
        .build_for(UringOptions::default(), args.rw.is_trim())
        .map_err(|e| BenchError::io(engine.to_string(), e))?;
    let r = run_job(monitor, eng, file, args.size, spec)
        .map_err(|e| BenchError::failed(e.to_string()))?;
    let p99 = r.total().latency_ns.value_at_quantile(0.99) as f64 / 1000.0;
    Ok(format!("{:.1} ({:.1})", r.mean_lat_us(), p99))
}
