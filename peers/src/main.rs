//! `aio-peers`: 4 KiB O_DIRECT random reads at QD 1 and QD 32 through aio-rs and through
//! tokio-uring, monoio, glommio and tokio's `spawn_blocking`, alternating the variants round
//! after round in one run, on the fast device and on a file.
//!
//! This file owns the command line, the targets (set up once, removed when it returns), the
//! order of the runs (each round runs every variant, odd rounds backwards, so no variant always
//! goes first), and what it prints; `main` alone prints an error and exits with its code. The
//! variants and the report are the library's ([`aio_peers`]).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aio_bench::error::BenchError;
use aio_bench::flags::check_target;
use aio_bench::targets::image::DiskImage;
use aio_bench::targets::loopdev::{LoopDevice, LoopSpec};
use aio_bench::units::{parse_duration, parse_poll_max_ns, parse_size};
use aio_peers::report::TargetRuns;
use aio_peers::{Job, Variant};
use clap::Parser;

/// `aio-peers`'s arguments.
#[derive(Parser, Debug)]
#[command(
    name = "aio-peers",
    version,
    about = "aio-rs next to tokio-uring, monoio, glommio and tokio's spawn_blocking: 4 KiB \
             O_DIRECT random reads at QD 1 and 32, alternating in one run"
)]
struct PeersArgs {
    /// Rounds; each runs every variant once (odd rounds in reverse order).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
    /// Measured time per run (2, 2s, 500ms).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    secs: Duration,
    /// Warm-up per run, before the measured window.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    ramp: Duration,
    /// Queue depths, comma-separated: workers, each with one read in flight.
    #[arg(long, value_delimiter = ',', default_value = "1,32",
          value_parser = clap::value_parser!(u64).range(1..=256))]
    qd: Vec<u64>,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Targets, comma-separated: `loop` (the fast device; needs root) and `file` (a file in
    /// `--dir`). Default: both as root, else `file`.
    #[arg(long, value_delimiter = ',', value_parser = ["loop", "file"])]
    targets: Vec<String>,
    /// The fast device: `loop` or `loop:SIZE` (default 512m), a loop device with direct I/O
    /// over a file in /dev/shm.
    #[arg(long, default_value = "loop")]
    device: LoopSpec,
    /// Directory of the `file` target (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of the `file` target.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    size: u64,
    /// Variants, comma-separated (default: all): tokio-uring, monoio, glommio,
    /// aio-uring-async, aio-uring-callback, aio-linux-aio-async, aio-linux-aio-callback,
    /// tokio-spawn-blocking, aio-pool-async, aio-pool-run-async.
    #[arg(long, value_delimiter = ',', value_parser = parse_variant)]
    variants: Vec<Variant>,
    /// aio-rs's adaptive polling limit (the default is QEMU's IOThread value, as `run` and
    /// `matrix` use; 0 turns polling off, as `vs-fio` does by default).
    #[arg(long, default_value = "32768", value_parser = parse_poll_max_ns)]
    poll_max_ns: aio_loop::PollMaxNs,
    /// aio-rs's fd monitor: `auto` (the probe's ladder, uring -> hybrid -> poll, as `run` and
    /// `matrix` pick; the one taken is printed), `uring`, `epoll` (`vs-fio`'s default),
    /// `shared-ring` (one io_uring for the monitor and the io_uring engine), `poll`, `hybrid`.
    #[arg(long, default_value = "auto")]
    fdmon: aio::Pairing,
    /// aio-rs's io_uring engine registers the file and the workers' buffers with its ring
    /// (`IORING_OP_READ_FIXED`, as glommio does; off by default, as the engine's own default).
    #[arg(long)]
    uring_registered: bool,
    /// Also write every run, the table and the ratios as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    Variant::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
        format!("unknown variant {s:?} (one of {})", names.join(", "))
    })
}

fn main() -> ExitCode {
    match run(PeersArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aio-peers: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The fd monitor the variants run on: `auto` climbs the probe's ladder once here (so every
/// variant runs on the same concrete monitor, and io_uring disabled by the sysctl falls back
/// as the other tools do), printing what it took and why.
fn resolve_fdmon(fdmon: aio::Pairing) -> Result<aio::Pairing, BenchError> {
    let aio::Pairing::Apart(aio::Choice::Auto) = fdmon else {
        return Ok(fdmon);
    };
    let picked = aio::MonitorKind::auto().map_err(|e| BenchError::Failed(e.to_string()))?;
    let reports: Vec<String> = picked.reports.iter().map(ToString::to_string).collect();
    println!("peers: fd monitor auto: {}", reports.join("; "));
    Ok(aio::Pairing::Apart(aio::Choice::Named(picked.kind)))
}

/// Runs the comparison.
fn run(args: PeersArgs) -> Result<(), BenchError> {
    let dir = check_target(args.dir.as_deref(), args.bs, args.size, "--size")?;
    let root = nix::unistd::geteuid().is_root();
    let targets = if args.targets.is_empty() {
        let mut t = vec!["file".to_string()];
        if root {
            t.insert(0, "loop".to_string());
        }
        t
    } else {
        args.targets.clone()
    };
    let variants = if args.variants.is_empty() {
        Variant::ALL.to_vec()
    } else {
        args.variants.clone()
    };
    let fdmon = resolve_fdmon(args.fdmon)?;
    println!(
        "peers: {} B O_DIRECT random reads, QD {:?}, {} rounds of {:?} (+{:?} warm-up) per run; \
         aio-rs: fd monitor {}, poll_max_ns {}{}; CPU = user+sys of the process (getrusage), \
         worker threads included",
        args.bs,
        args.qd,
        args.rounds,
        args.secs,
        args.ramp,
        fdmon,
        args.poll_max_ns,
        if args.uring_registered {
            ", io_uring registered files and buffers"
        } else {
            ""
        }
    );
    // Progress on a terminal only: a redirected stderr keeps just the failures.
    let progress = std::io::stderr().is_terminal();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for name in &targets {
        // The device, if any, must outlive the image.
        let (_device, image, label) = target(name, &args, &dir)?;
        let mut runs = TargetRuns {
            label,
            name: name.clone(),
            ..TargetRuns::default()
        };
        for &qd in &args.qd {
            let job = Job {
                path: image.shared_path(),
                blocks: image.size() / args.bs,
                bs: args.bs as usize,
                qd: qd as usize,
                ramp: args.ramp,
                secs: args.secs,
                poll_max_ns: args.poll_max_ns,
                fdmon,
                uring_registered: args.uring_registered,
            };
            let mut live = variants.clone();
            for round in 0..args.rounds {
                let order: Vec<Variant> = aio_bench::rounds::order(round as usize, live.len())
                    .map(|i| live[i])
                    .collect();
                for v in order {
                    if progress {
                        eprint!(
                            "\r{name} QD{qd} round {}/{}: {v:<24}",
                            round + 1,
                            args.rounds
                        );
                    }
                    match aio_peers::run(v, &job) {
                        Ok(sample) => runs.add(qd as usize, v, sample),
                        Err(e) => {
                            eprintln!("\n{v} on {name} failed: {e}; left out from here on");
                            failures.push((name.clone(), qd, v, e.to_string()));
                            live.retain(|x| *x != v);
                        }
                    }
                }
            }
        }
        if progress {
            eprintln!();
        }
        runs.print();
        report.push(runs);
    }
    for (t, qd, v, e) in &failures {
        println!("failed: {v} on {t} at QD{qd}: {e}");
    }
    if let Some(path) = &args.json {
        let value = PeersReport {
            bs: args.bs,
            qd: &args.qd,
            rounds: args.rounds,
            secs: args.secs.as_secs_f64(),
            ramp_s: args.ramp.as_secs_f64(),
            poll_max_ns: aio_bench::fio::output::poll_max_ns_json(args.poll_max_ns),
            fdmon: fdmon.to_string(),
            uring_registered: args.uring_registered,
            targets: report.iter().map(TargetRuns::to_json).collect(),
            failures: failures
                .iter()
                .map(|(target, qd, v, error)| Failure {
                    target,
                    qd: *qd,
                    variant: v.name(),
                    error,
                })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
        std::fs::write(path, text + "\n")
            .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))?;
    }
    Ok(())
}

/// The JSON report (`--json`): the run's settings, each target's rows and ratios, and the
/// variants that failed.
#[derive(serde::Serialize)]
struct PeersReport<'a> {
    bs: u64,
    qd: &'a [u64],
    rounds: u64,
    secs: f64,
    ramp_s: f64,
    poll_max_ns: serde_json::Value,
    fdmon: String,
    uring_registered: bool,
    targets: Vec<serde_json::Value>,
    failures: Vec<Failure<'a>>,
}

/// A variant that failed on a target, left out from there on.
#[derive(serde::Serialize)]
struct Failure<'a> {
    target: &'a str,
    qd: u64,
    variant: &'static str,
    error: &'a str,
}

/// Sets up the target called `name`: the fast device (whole) or a file in `dir`.
fn target(
    name: &str,
    args: &PeersArgs,
    dir: &std::path::Path,
) -> Result<(Option<LoopDevice>, DiskImage, String), BenchError> {
    if name == "loop" {
        let dev = LoopDevice::attach(args.device)?;
        let image = dev.whole()?;
        let label = format!(
            "loop device {} ({} MiB, direct I/O over /dev/shm)",
            image.path().display(),
            image.size() >> 20
        );
        return Ok((Some(dev), image, label));
    }
    let path = dir.join(format!("aio-bench-peers-{}.img", std::process::id()));
    let image = DiskImage::create(path, args.size, 0).map_err(|e| {
        BenchError::bad_input(format!("creating the test file in {}: {e}", dir.display()))
    })?;
    let label = format!(
        "file {} ({} MiB, O_DIRECT)",
        image.path().display(),
        args.size >> 20
    );
    Ok((None, image, label))
}
