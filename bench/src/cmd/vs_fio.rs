//! `aio-bench vs-fio`: one job through fio and through one of our engines, alternating A B for
//! `--rounds`, with IOPS, mean latency and their ratios.
//!
//! This module owns the comparison: the checks (`--fdmon shared-ring` with `--engine uring` only,
//! fio installed), the test target shared by both (a file, or the fast device), the rounds
//! and the table. It never builds fio's command line or reads fio's output
//! ([`aio_bench::fio`]), and never measures our side itself ([`aio_bench::fio::job::run_job`]).

use aio::{Backends, Choice, EngineKind, EngineOptions, Pairing};
use aio_bench::error::BenchError;
use aio_bench::fio::job::{run_job, JobResult, JobSpec};
use aio_bench::fio::{self, FioResult};
use aio_bench::targets::image::DiskImage;
use aio_core::engine::IoFile;
use aio_loop::PollMaxNs;

use crate::VsFioArgs;

/// Runs `vs-fio`.
pub fn run(mut args: VsFioArgs) -> Result<(), BenchError> {
    if args.fdmon == Pairing::SharedRing && args.engine != EngineKind::Uring {
        return Err(BenchError::bad_input(format!(
            "--fdmon shared-ring needs --engine uring (got {})",
            args.engine
        )));
    }
    if args.rw.is_trim() && args.target.device.is_none() {
        return Err(BenchError::bad_input(format!(
            "--rw {}: fio trims block devices only (BLKDISCARD; a file fails with ENOTTY): add --device loop",
            args.rw
        )));
    }
    let version = fio::version()?;
    let spec = JobSpec {
        ramp: args.ramp,
        poll_max_ns: args.poll_max_ns,
        max_batch: args.max_batch.map(|n| n as usize),
        ..JobSpec::new(
            args.rw,
            args.bs as usize,
            args.iodepth as usize,
            args.runtime,
        )
    };
    // On the fast device, both fio and ours use all of it.
    let (_device, image) = args.target.open(args.bs)?;
    print_header(&args, &version, &image);
    let mut totals = Totals::default();
    for round in 0..args.rounds {
        let (f, o) = one_round(&args, &image, spec, round as usize)?;
        print_round(round + 1, &f, &o);
        totals.add(&f, &o);
    }
    totals.print(args.rounds as f64);
    Ok(())
}

/// What runs against what, on which file, and the table's header.
fn print_header(args: &VsFioArgs, version: &str, image: &DiskImage) {
    let fdmon = if args.fdmon == Pairing::SharedRing {
        "uring, one shared ring".to_string()
    } else {
        args.fdmon.to_string()
    };
    let polling = if args.poll_max_ns == PollMaxNs::Fixed(0) {
        "polling off".to_string()
    } else {
        format!("poll_max_ns {}", args.poll_max_ns)
    };
    println!(
        "vs-fio: {} ({fdmon}, {polling}) vs {version} --ioengine={}",
        args.engine,
        aio_bench::fio::ioengine(args.engine)
    );
    println!(
        "job: {} bs={} iodepth={} runtime={:?} ramp={:?} file={} ({} MiB, O_DIRECT)",
        args.rw,
        args.bs,
        args.iodepth,
        args.runtime,
        args.ramp,
        image.path().display(),
        args.target.size >> 20
    );
    println!(
        "{:<6} {:>12} {:>12} {:>7}   {:>12} {:>12} {:>7}   {:>8}",
        "round", "fio IOPS", "ours IOPS", "ratio", "fio lat us", "ours lat us", "ratio", "our CPU"
    );
}

/// One pair: fio then ours (ours first in every second round, B A); a request that failed in
/// our run fails the comparison.
fn one_round(
    args: &VsFioArgs,
    image: &DiskImage,
    spec: JobSpec,
    round: usize,
) -> Result<(FioResult, JobResult), BenchError> {
    let (mut f, mut o) = (None, None);
    for side in aio_bench::rounds::order(round, 2) {
        if side == 0 {
            let engine = aio_bench::fio::ioengine(args.engine);
            f = Some(fio::run(
                engine,
                &image.shared_path(),
                args.target.size,
                &spec,
            )?);
        } else {
            o = Some(ours(args, image.file(), spec)?);
        }
    }
    let (f, o) = (f.expect("fio ran"), o.expect("ours ran"));
    if o.errors > 0 {
        return Err(BenchError::failed(format!(
            "{} requests failed in our run",
            o.errors
        )));
    }
    Ok((f, o))
}

/// Our side of a round: the chosen fd monitor and engine, or one shared io_uring; a trim's
/// discards on a block device go to a thread pool behind the engine (io_uring and Linux AIO
/// refuse them).
fn ours(args: &VsFioArgs, file: &IoFile, spec: JobSpec) -> Result<JobResult, BenchError> {
    let options = EngineOptions::default().with_fallback_pool(args.rw.is_trim());
    let pair = Backends::build(args.fdmon, Choice::Named(args.engine), &options).map_err(|e| {
        BenchError::io(
            format!("fd monitor {} and engine {}", args.fdmon, args.engine),
            e.into(),
        )
    })?;
    run_job(
        pair.monitor.built,
        pair.engine.built,
        file,
        args.target.size,
        spec,
    )
    .map_err(|e| BenchError::io("our run failed", e))
}

/// One round's row.
fn print_round(round: u64, f: &FioResult, o: &JobResult) {
    println!(
        "{:<6} {:>12.0} {:>12.0} {:>7.3}   {:>12.1} {:>12.1} {:>7.3}   {:>7.0}%",
        round,
        f.iops,
        o.iops(),
        o.iops() / f.iops,
        f.mean_lat_us,
        o.mean_lat_us(),
        o.mean_lat_us() / f.mean_lat_us,
        100.0 * o.iothread_cpu_s / o.wall_s
    );
}

/// The rounds' sums, for the mean row.
#[derive(Default)]
struct Totals {
    fio_iops: f64,
    our_iops: f64,
    fio_lat: f64,
    our_lat: f64,
}

impl Totals {
    fn add(&mut self, f: &FioResult, o: &JobResult) {
        self.fio_iops += f.iops;
        self.our_iops += o.iops();
        self.fio_lat += f.mean_lat_us;
        self.our_lat += o.mean_lat_us();
    }

    /// The mean row over `n` rounds, and what the ratios mean.
    fn print(&self, n: f64) {
        println!(
            "{:<6} {:>12.0} {:>12.0} {:>7.3}   {:>12.1} {:>12.1} {:>7.3}",
            "mean",
            self.fio_iops / n,
            self.our_iops / n,
            self.our_iops / self.fio_iops,
            self.fio_lat / n,
            self.our_lat / n,
            self.our_lat / self.fio_lat
        );
        println!("ratios are ours / fio: IOPS higher is better, latency lower is better");
    }
}
