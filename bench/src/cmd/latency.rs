//! `aio-bench latency`: QD1 latency per engine with the loop's polling off, at QEMU's IOThread
//! default and at the values given (the measurement of QEMU's thread-pool notifier/io_poll
//! change).
//!
//! This module owns the subcommand's run: the engines and polling limits compared, the test
//! target (a file, or the fast device) and the table, mean latency with p99 per cell. It never
//! measures anything itself ([`aio_bench::fio::job::run_job`]).

use std::time::Duration;

use aio::{EngineKind, EngineOptions};
use aio_bench::error::BenchError;
use aio_bench::fio::job::{run_job, JobSpec};
use aio_core::engine::IoFile;
use aio_loop::PollMaxNs;

use crate::LatencyArgs;

/// The warm-up of each cell.
const RAMP: Duration = Duration::from_millis(300);

/// Runs `latency`.
pub fn run(mut args: LatencyArgs) -> Result<(), BenchError> {
    let engines: Vec<EngineKind> = if args.engine.is_empty() {
        EngineKind::available()
    } else {
        args.engine.clone()
    };
    // Off and QEMU's IOThread default, then the values given.
    let mut polls = vec![
        PollMaxNs::Fixed(0),
        PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
    ];
    for &p in &args.poll_max_ns {
        if !polls.contains(&p) {
            polls.push(p);
        }
    }
    let (_device, image) = args.target.open(args.bs)?;
    println!(
        "QD1 {} bs={} on {} ({} MiB, O_DIRECT), fd monitor {}, {:?} per cell, {} run(s) each: \
         mean latency in µs (p99), the median run",
        args.rw,
        args.bs,
        image.path().display(),
        args.target.size >> 20,
        args.fdmon,
        args.runtime,
        args.repeat
    );
    // Every round runs every cell once, so that a disturbance hits all of them alike.
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); polls.len()]; engines.len()];
    for _ in 0..args.repeat {
        for (e, &engine) in engines.iter().enumerate() {
            for (p, &poll_max_ns) in polls.iter().enumerate() {
                runs[e][p].push(one_run(&args, engine, poll_max_ns, image.file())?);
            }
        }
    }
    print!("{:<10}", "engine");
    for p in &polls {
        print!(" {:>22}", format!("poll_max_ns={p}"));
    }
    println!();
    for (e, engine) in engines.iter().enumerate() {
        print!("{:<10}", engine.name());
        for cell in &runs[e] {
            let m = median(cell);
            print!(" {:>22}", format!("{:.1} ({:.1})", m.mean_us, m.p99_us));
        }
        println!();
    }
    if args.detail {
        println!(
            "{:<10} {:>12} {:>9} {:>9} {:>8} {:>10} {:>9} {:>9} {:>10} {:>9} {:>11} {:>12} {:>9}",
            "engine",
            "poll_max_ns",
            "mean us",
            "p99 us",
            "spread",
            "CPU us/req",
            "polling",
            "missed",
            "window ns",
            "wake ns",
            "followup ns",
            "auto off",
            "cut/req"
        );
        for (e, engine) in engines.iter().enumerate() {
            for (p, cell) in runs[e].iter().enumerate() {
                let m = median(cell);
                println!(
                    "{:<10} {:>12} {:>9.1} {:>9.1} {:>8.2} {:>10.2} {:>8.1}% {:>8.1}% {:>10} {:>9} {:>11} {:>12} {:>9.3}",
                    engine.name(),
                    polls[p].to_string(),
                    m.mean_us,
                    m.p99_us,
                    spread(cell),
                    m.cpu_us_per_req,
                    m.polling_share * 100.0,
                    m.missed_share * 100.0,
                    m.window_ns,
                    m.wake_ns,
                    m.followup_ns,
                    format!("{}/{}", m.auto_off, m.auto_choices),
                    m.budget_cuts_per_req
                );
            }
        }
    }
    Ok(())
}

/// One run of one cell.
#[derive(Debug, Clone, Copy)]
struct Run {
    mean_us: f64,
    p99_us: f64,
    /// The loop thread's CPU time per request.
    cpu_us_per_req: f64,
    /// Busy polling's share of the loop thread's wall time, and that of polling that found
    /// nothing.
    polling_share: f64,
    missed_share: f64,
    /// The window at the end of the run, and the wake-up cost `auto` weighed it against.
    window_ns: u64,
    wake_ns: u64,
    /// What `auto` added to a miss's cost for the longer wait after a sleep.
    followup_ns: u64,
    /// `auto`'s choices, and how many of them turned polling off.
    auto_choices: u64,
    auto_off: u64,
    /// Windows `auto`'s CPU budget cut short, per request.
    budget_cuts_per_req: f64,
}

/// The run with the median mean latency (the lower middle one for an even count).
fn median(runs: &[Run]) -> Run {
    aio_bench::rounds::median_round(runs.to_vec(), |r| r.mean_us).expect("at least one run")
}

/// The largest mean over the smallest.
fn spread(runs: &[Run]) -> f64 {
    aio_bench::rounds::spread(runs.iter().map(|r| r.mean_us))
}

/// One run at QD1.
fn one_run(
    args: &LatencyArgs,
    engine: EngineKind,
    poll_max_ns: PollMaxNs,
    file: &IoFile,
) -> Result<Run, BenchError> {
    let spec = JobSpec {
        ramp: RAMP,
        poll_max_ns,
        ..JobSpec::new(args.rw, args.bs as usize, 1, args.runtime)
    };
    let monitor = args
        .fdmon
        .build()
        .map_err(|e| BenchError::io(args.fdmon.to_string(), e.into()))?;
    let eng = engine
        .build(&EngineOptions::default().with_fallback_pool(args.rw.is_trim()))
        .map_err(|e| BenchError::io(engine.to_string(), e.into()))?;
    let r = run_job(monitor, eng, file, args.target.size, spec)
        .map_err(|e| BenchError::failed(e.to_string()))?;
    let total = r.total();
    // The CPU time covers the whole job, ramp included: so does the request count.
    let requests = (r.iops() * r.wall_s).max(1.0);
    let wall_ns = (r.wall_s * 1e9).max(1.0);
    Ok(Run {
        mean_us: r.mean_lat_us(),
        p99_us: total.latency_ns.value_at_quantile(0.99) as f64 / 1000.0,
        cpu_us_per_req: r.iothread_cpu_s * 1e6 / requests,
        polling_share: r.counters.busy_poll_ns as f64 / wall_ns,
        missed_share: r.counters.busy_poll_missed_ns as f64 / wall_ns,
        window_ns: r.counters.poll_ns,
        wake_ns: r.counters.poll_wake_ns,
        followup_ns: r.counters.poll_followup_ns,
        auto_choices: r.counters.poll_auto_choices,
        auto_off: r.counters.poll_auto_off,
        budget_cuts_per_req: r.counters.poll_auto_budget_cuts as f64 / requests,
    })
}
