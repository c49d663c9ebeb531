//! `aio-bench`: compare aio-rs backends, and compare them with fio.
//!
//! Subcommands: `matrix` (the scsi-disk scaling test from the QEMU epoll discussion, 1..256
//! disks on one IOThread), `latency` (QD1 latency per engine, the measurement of QEMU's
//! thread-pool notifier/io_poll change: polling off, at QEMU's default, and at given values),
//! `run` (fio job files, reported in fio's formats), `vs-fio` (the same job through fio and
//! through one of our engines, alternating A B / B A) and `probe` (which backends this build
//! and kernel offer, and what `auto` picks).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use aio_bench::cleanup::RunDir;
use aio_bench::cpus::CpuList;
use aio_bench::engines::EngineKind;
use aio_bench::fio;
use aio_bench::image::{free_bytes, DiskImage};
use aio_bench::job::{run_job, JobResult, JobSpec, Pattern};
use aio_bench::loopdev::{LoopDevice, LoopSpec};
use aio_bench::monitors::MonitorKind;
use aio_bench::progress::Progress;
use aio_bench::units::{parse_duration, parse_size};
use aio_core::engine::IoFile;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "aio-bench", version, about = "Benchmarks for aio-rs backends")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The scsi-disk scaling matrix (the QEMU epoll discussion's test): MB/s as 1..256 disks
    /// share one iothread.
    Matrix(Box<MatrixArgs>),
    /// QD1 latency per engine with the loop's polling off, at QEMU's IOThread default, and at
    /// the values given (as QEMU measured its thread-pool notifier/io_poll change).
    Latency(LatencyArgs),
    /// Run one job through fio and through an aio-rs engine, alternating (A B, B A, ...), and
    /// print both figures and their ratio.
    VsFio(VsFioArgs),
    /// Run fio job files through aio-rs engines and report like fio.
    Run(RunArgs),
    /// Say which fd monitors and engines this build and kernel offer, and what `auto` picks.
    Probe,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// fio job files (`[global]` and job sections; see `aio_bench::jobfile` for the options).
    #[arg(required = true)]
    jobfiles: Vec<PathBuf>,
    /// `normal` (fio's text summary) or `json` (fio's JSON field names).
    #[arg(long, default_value = "normal", value_parser = ["normal", "json"])]
    output_format: String,
    /// Run every job on the fast device, `loop` or `loop:SIZE` (default 512m): a loop device
    /// with direct I/O over a file in /dev/shm (needs root). Replaces the jobs' `filename=` and
    /// `directory=`; their `size=` is limited to the device's.
    #[arg(long, value_parser = parse_device)]
    device: Option<LoopSpec>,
}

#[derive(clap::Args, Debug)]
struct VsFioArgs {
    /// Our engine: pool, linux-aio or uring (compared with fio's psync, libaio or io_uring).
    #[arg(long, default_value = "linux-aio", value_parser = parse_engine)]
    engine: EngineKind,
    /// read, write, randread, randwrite, rw or randrw (mixed 50/50).
    #[arg(long, default_value = "randread", value_parser = parse_pattern)]
    rw: Pattern,
    /// Block size (fio units: 4k, 64k, 1m).
    #[arg(long, default_value = "4k", value_parser = parse_size_arg)]
    bs: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    iodepth: u64,
    /// Measured time per run (10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    runtime: Duration,
    /// Warm-up before measuring, per run.
    #[arg(long, default_value = "1s", value_parser = parse_duration_arg)]
    ramp: Duration,
    /// Size of the test file.
    #[arg(long, default_value = "256m", value_parser = parse_size_arg)]
    size: u64,
    /// Directory for the test file (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A B pairs to run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
    /// The fast device instead of the test file, for fio and ours alike: `loop` or `loop:SIZE`
    /// (default 512m), a loop device with direct I/O over a file in /dev/shm (needs root).
    #[arg(long, value_parser = parse_device, conflicts_with_all = ["dir", "size"])]
    device: Option<LoopSpec>,
    /// Our fd monitor.
    #[arg(long, default_value = "epoll", value_parser = parse_monitor)]
    fdmon: MonitorKind,
    /// Our loop's adaptive polling limit (0 = off, as fio's libaio engine waits in the kernel).
    #[arg(long, default_value_t = 0)]
    poll_max_ns: u64,
    /// With `--engine uring`: one io_uring for the fd monitor and the engine (implies
    /// `--fdmon uring`), so completions need no eventfd.
    #[arg(long)]
    shared_ring: bool,
    /// Our engine's largest batch per submission (default: the engine's, 32). Requests that
    /// completion callbacks resubmit go out whenever a batch is full; a batch is never larger
    /// than what the kernel already holds (aio-core's batch rule).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    max_batch: Option<u64>,
}

#[derive(clap::Args, Debug)]
struct LatencyArgs {
    /// Engines, comma-separated. Default: all this build has.
    #[arg(long, value_delimiter = ',', value_parser = parse_engine)]
    engine: Vec<EngineKind>,
    /// poll_max_ns values beyond 0 and 32768, comma-separated.
    #[arg(long, value_delimiter = ',')]
    poll_max_ns: Vec<u64>,
    /// read, write, randread, randwrite, rw or randrw (mixed 50/50).
    #[arg(long, default_value = "randread", value_parser = parse_pattern)]
    rw: Pattern,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = parse_size_arg)]
    bs: u64,
    /// Measured time per cell.
    #[arg(long, default_value = "3s", value_parser = parse_duration_arg)]
    runtime: Duration,
    /// Size of the test file.
    #[arg(long, default_value = "64m", value_parser = parse_size_arg)]
    size: u64,
    /// Directory for the test file (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The fast device instead of the test file: `loop` or `loop:SIZE` (default 512m), a loop
    /// device with direct I/O over a file in /dev/shm (needs root).
    #[arg(long, value_parser = parse_device, conflicts_with_all = ["dir", "size"])]
    device: Option<LoopSpec>,
    /// Our fd monitor.
    #[arg(long, default_value = "epoll", value_parser = parse_monitor)]
    fdmon: MonitorKind,
}

#[derive(clap::Args, Debug)]
struct MatrixArgs {
    /// Fd monitors, comma-separated (poll,epoll,hybrid,uring, or auto: what the probe picks).
    /// Default: all this build and kernel have.
    #[arg(long, value_delimiter = ',', value_parser = parse_monitor_or_auto)]
    fdmon: Vec<MonitorKind>,
    /// Engines, comma-separated (pool,linux-aio,uring, or auto: what the probe picks).
    /// Default: all this build and kernel have.
    #[arg(long, value_delimiter = ',', value_parser = parse_engine_or_auto)]
    engine: Vec<EngineKind>,
    /// Disk counts, comma-separated (1..=256). Default: 1,16,256 (--full: 1,4,8,...,256).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=256))]
    disks: Vec<u64>,
    /// Workloads, comma-separated (rd,wr,randrw). Default: rd,randrw (--full: all three).
    #[arg(long, value_delimiter = ',', value_parser = parse_workload)]
    workloads: Vec<aio_bench::matrix::Workload>,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = parse_size_arg)]
    bs: u64,
    /// Requests in flight per driven disk.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    iodepth: u64,
    /// Drive one disk (the QEMU epoll discussion's setup) or all of them.
    #[arg(long, default_value = "one", value_parser = ["one", "all"])]
    active: String,
    /// Measured time per cell.
    #[arg(long, default_value = "1s", value_parser = parse_duration_arg)]
    runtime: Duration,
    /// Warm-up per cell.
    #[arg(long, default_value = "200ms", value_parser = parse_duration_arg)]
    ramp: Duration,
    /// Directory for the disk images (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of each driven disk's image.
    #[arg(long, default_value = "64m", value_parser = parse_size_arg)]
    disk_size: u64,
    /// The disks on the fast device instead of image files: `loop` or `loop:SIZE` (default
    /// 512m), a loop device with direct I/O over a file in /dev/shm (needs root); each disk
    /// gets its own fd and SIZE / disks of it.
    #[arg(long, value_parser = parse_device, conflicts_with_all = ["dir", "disk_size"])]
    device: Option<LoopSpec>,
    /// The iothread's adaptive polling limit (QEMU's IOThread default).
    #[arg(long, default_value_t = 32768)]
    poll_max_ns: u64,
    /// How long an idle disk stays in the poll set. QEMU uses 7 s; the matrix's cells are
    /// short, so the default (100ms, shorter than the ramp) measures the steady state in which
    /// idle disks have left it, as they would in a long-running QEMU.
    #[arg(long, default_value = "100ms", value_parser = parse_duration_arg)]
    poll_idle: Duration,
    /// Write the cells as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the cells as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write an SVG chart (MB/s against disks, a line per fd monitor and engine).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// All pairs, all disk counts, all workloads.
    #[arg(long)]
    full: bool,
    /// Run every cell this many times, round after round, and report each cell's median run:
    /// steadier figures on a noisy machine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    repeat: u64,
    /// Stamp every block written with its offset, a generation and a crc32c, and check every
    /// block read; report mismatches with their disk and offset (exit code 1 if any).
    #[arg(long)]
    verify: bool,
    /// Run every thread of the bench (iothread, guests, pool workers) on these CPUs
    /// (`0`, `0,1`, `0-3`), as `taskset` would. On a small VM, `--cpus 0` keeps the scheduler
    /// from moving the guest and the iothread between vCPUs, the largest source of noise.
    #[arg(long)]
    cpus: Option<CpuList>,
}

fn parse_workload(s: &str) -> Result<aio_bench::matrix::Workload, String> {
    s.parse()
}

fn parse_engine(s: &str) -> Result<EngineKind, String> {
    s.parse()
        .map_err(|e: aio_bench::engines::UnknownEngine| e.to_string())
}
fn parse_monitor(s: &str) -> Result<MonitorKind, String> {
    s.parse()
        .map_err(|e: aio_bench::monitors::UnknownMonitor| e.to_string())
}
/// A monitor name or `auto` (resolved now, by the probe order uring -> hybrid -> poll).
fn parse_monitor_or_auto(s: &str) -> Result<MonitorKind, String> {
    if s == "auto" {
        return aio_bench::monitors::auto()
            .map(|(k, _)| k)
            .map_err(|e| e.to_string());
    }
    parse_monitor(s).map_err(|e| format!("{e}, or auto"))
}
/// An engine name or `auto` (resolved now, by the probe order uring -> linux-aio -> pool).
fn parse_engine_or_auto(s: &str) -> Result<EngineKind, String> {
    if s == "auto" {
        return aio_bench::engines::auto()
            .map(|(k, _)| k)
            .map_err(|e| e.to_string());
    }
    parse_engine(s).map_err(|e| format!("{e}, or auto"))
}
fn parse_pattern(s: &str) -> Result<Pattern, String> {
    s.parse()
}
fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}
fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}
fn parse_device(s: &str) -> Result<LoopSpec, String> {
    s.parse()
        .map_err(|e: aio_bench::loopdev::LoopError| e.to_string())
}

/// The O_DIRECT test target of `vs-fio` and `latency`: the whole fast device with `--device`,
/// else a file of `size` bytes in `dir` (exit code 2 if it cannot be made).
fn test_image(
    dir: &Path,
    size: u64,
    device: Option<LoopSpec>,
) -> Result<(Option<LoopDevice>, DiskImage), (u8, String)> {
    if let Some(spec) = device {
        let dev = LoopDevice::attach(spec)?;
        let image = dev.whole()?;
        return Ok((Some(dev), image));
    }
    let path = dir.join(format!("aio-bench-{}.img", std::process::id()));
    let image = DiskImage::create(path, size, 0).map_err(|e| {
        (
            2,
            format!("creating the test file in {}: {e}", dir.display()),
        )
    })?;
    Ok((None, image))
}

fn ours(args: &VsFioArgs, file: &IoFile, spec: JobSpec) -> Result<JobResult, String> {
    if args.shared_ring {
        #[cfg(feature = "uring")]
        {
            let (monitor, engine) =
                aio_backend_uring::shared_ring(aio_backend_uring::UringConfig::default())
                    .map_err(|e| format!("shared ring: {e}"))?;
            return run_job(monitor, engine, file, args.size, spec)
                .map_err(|e| format!("our run failed: {e}"));
        }
        #[cfg(not(feature = "uring"))]
        return Err("--shared-ring needs the uring feature".into());
    }
    let monitor = args
        .fdmon
        .build()
        .map_err(|e| format!("fd monitor {}: {e}", args.fdmon))?;
    let engine = args
        .engine
        .build()
        .map_err(|e| format!("engine {}: {e}", args.engine))?;
    run_job(monitor, engine, file, args.size, spec).map_err(|e| format!("our run failed: {e}"))
}

/// Checks `--dir` (default: the system temp dir), `--bs` and the image size; exit code 2 with
/// a message naming the flag on bad input.
fn check_target(
    dir: Option<&Path>,
    bs: u64,
    size: u64,
    size_flag: &str,
) -> Result<PathBuf, (u8, String)> {
    let dir = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    if !dir.is_dir() {
        return Err((
            2,
            format!("--dir {}: not an existing directory", dir.display()),
        ));
    }
    if bs == 0 || bs % 512 != 0 {
        return Err((
            2,
            format!("--bs {bs}: must be a non-zero multiple of 512 (O_DIRECT)"),
        ));
    }
    if size < bs {
        return Err((2, format!("{size_flag} {size} is smaller than --bs {bs}")));
    }
    Ok(dir)
}

fn vs_fio(mut args: VsFioArgs) -> Result<(), (u8, String)> {
    let bad = |m: String| (2u8, m);
    // On the fast device, both fio and ours use all of it.
    args.size = args.device.map_or(args.size, |d| d.size);
    let dir = check_target(args.dir.as_deref(), args.bs, args.size, "--size")?;
    if args.shared_ring && args.engine != EngineKind::Uring {
        return Err(bad(format!(
            "--shared-ring needs --engine uring (got {})",
            args.engine
        )));
    }
    let version = fio::version().map_err(|e| (2, e.to_string()))?;
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
    let (_device, image) = test_image(&dir, args.size, args.device)?;
    let file = image.file().clone();
    let ioengine = args.engine.fio_ioengine();
    let fdmon = if args.shared_ring {
        "uring, one shared ring".to_string()
    } else {
        args.fdmon.to_string()
    };
    let polling = if args.poll_max_ns == 0 {
        "polling off".to_string()
    } else {
        format!("poll_max_ns {}", args.poll_max_ns)
    };
    println!(
        "vs-fio: {} ({fdmon}, {polling}) vs {version} --ioengine={ioengine}",
        args.engine
    );
    println!(
        "job: {} bs={} iodepth={} runtime={:?} ramp={:?} file={} ({} MiB, O_DIRECT)",
        args.rw,
        args.bs,
        args.iodepth,
        args.runtime,
        args.ramp,
        image.path().display(),
        args.size >> 20
    );
    println!(
        "{:<6} {:>12} {:>12} {:>7}   {:>12} {:>12} {:>7}   {:>8}",
        "round", "fio IOPS", "ours IOPS", "ratio", "fio lat us", "ours lat us", "ratio", "our CPU"
    );
    let (mut fio_iops, mut our_iops, mut fio_lat, mut our_lat) = (0.0, 0.0, 0.0, 0.0);
    for round in 1..=args.rounds {
        let f =
            fio::run(ioengine, image.path(), args.size, &spec).map_err(|e| (1, e.to_string()))?;
        let o = ours(&args, &file, spec).map_err(|e| (1, e))?;
        if o.errors > 0 {
            return Err((1, format!("{} requests failed in our run", o.errors)));
        }
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
        fio_iops += f.iops;
        our_iops += o.iops();
        fio_lat += f.mean_lat_us;
        our_lat += o.mean_lat_us();
    }
    let n = args.rounds as f64;
    println!(
        "{:<6} {:>12.0} {:>12.0} {:>7.3}   {:>12.1} {:>12.1} {:>7.3}",
        "mean",
        fio_iops / n,
        our_iops / n,
        our_iops / fio_iops,
        fio_lat / n,
        our_lat / n,
        our_lat / fio_lat
    );
    println!("ratios are ours / fio: IOPS higher is better, latency lower is better");
    Ok(())
}

fn matrix(args: MatrixArgs) -> Result<(), (u8, String)> {
    use aio_bench::matrix::{self, MatrixSpec, Workload};
    use aio_bench::scsi::CellSpec;
    let bad = |m: String| (2u8, m);
    let dir = check_target(args.dir.as_deref(), args.bs, args.disk_size, "--disk-size")?;
    if let Some(CpuList(cpus)) = &args.cpus {
        aio_bench::cpus::pin_to(cpus).map_err(bad)?;
    }
    let fdmons: Vec<MonitorKind> = if args.fdmon.is_empty() {
        MonitorKind::available()
    } else {
        args.fdmon.clone()
    };
    let engines: Vec<EngineKind> = if args.engine.is_empty() {
        EngineKind::available()
    } else {
        args.engine.clone()
    };
    let disks: Vec<usize> = if !args.disks.is_empty() {
        args.disks.iter().map(|&d| d as usize).collect()
    } else if args.full {
        vec![1, 4, 8, 16, 32, 64, 128, 256]
    } else {
        vec![1, 16, 256]
    };
    let workloads = if !args.workloads.is_empty() {
        args.workloads.clone()
    } else if args.full {
        Workload::ALL.to_vec()
    } else {
        vec![Workload::Rd, Workload::RandRw]
    };
    let mut spec = MatrixSpec {
        fdmons,
        engines,
        disks,
        workloads,
        active_all: args.active == "all",
        cell: CellSpec {
            disks: 1,
            active: 1,
            pattern: Pattern::Read,
            bs: args.bs as usize,
            iodepth: args.iodepth as usize,
            runtime: args.runtime,
            ramp: args.ramp,
            poll_max_ns: args.poll_max_ns,
            poll_idle: args.poll_idle,
            verify: args.verify,
        },
        disk_size: args.disk_size,
        repeat: args.repeat as usize,
    };
    // The disks: regions of the fast device, or images in a private directory (removed
    // afterwards, also on a signal or an error).
    let max_disks = spec.max_disks();
    let (_device, _run_dir, images, place) = match args.device {
        Some(loop_spec) => {
            spec.disk_size = loop_spec.per_disk(max_disks as u64, args.bs)?;
            let dev = LoopDevice::attach(loop_spec)?;
            let images = dev.disks(max_disks, spec.disk_size, args.bs as usize, |i| {
                spec.is_stamped(i)
            })?;
            let place = format!(
                "disks on {} ({} KiB each, direct I/O over {})",
                dev.path().display(),
                spec.disk_size >> 10,
                dev.backing_file().display()
            );
            (Some(dev), None, images, place)
        }
        None => {
            let run_dir = dir.join(format!("aio-bench-matrix-{}", std::process::id()));
            let run_dir = RunDir::create(run_dir.clone())
                .map_err(|e| bad(format!("creating {}: {e}", run_dir.display())))?;
            // Enough free space (driven disks at --disk-size, idle ones at 1 MiB)?
            let driven = if spec.active_all { max_disks as u64 } else { 1 };
            let needed = driven * args.disk_size + (max_disks as u64 - driven) * (1 << 20);
            let free = free_bytes(run_dir.path());
            if free < needed {
                return Err(bad(format!(
                    "--dir {}: {} MiB free, the images need {} MiB (use --disk-size, --disks or another --dir)",
                    dir.display(),
                    free >> 20,
                    needed >> 20
                )));
            }
            let images = matrix::create_images(&spec, run_dir.path())
                .map_err(|e| (1, format!("matrix: creating the images: {e}")))?;
            let place = format!("images in {}", run_dir.path().display());
            (None, Some(run_dir), images, place)
        }
    };
    eprintln!(
        "matrix: fdmon {:?} x engine {:?} x disks {:?} x workloads {:?}; bs {} iodepth {} active {} runtime {:?}{}{}; {}",
        spec.fdmons.iter().map(|k| k.name()).collect::<Vec<_>>(),
        spec.engines.iter().map(|k| k.name()).collect::<Vec<_>>(),
        spec.disks,
        spec.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        args.bs,
        args.iodepth,
        args.active,
        args.runtime,
        if args.repeat > 1 {
            format!("; median of {} rounds", args.repeat)
        } else {
            String::new()
        },
        args.cpus
            .as_ref()
            .map(|c| format!("; on CPUs {:?}", c.0))
            .unwrap_or_default(),
        place
    );
    let total = spec.run_count();
    let progress = Progress::new(total as u64, "cell runs");
    let cells = matrix::run_on(&spec, &images, |i, _, c| {
        progress.step(
            i as u64,
            format!(
                "{} {} disks={} {}: {:.1} MB/s, {:.0} IOPS",
                c.engine,
                c.fdmon,
                c.disks,
                c.workload.name(),
                c.mb_s(),
                c.iops()
            ),
        );
    })
    .map_err(|e| (1, format!("matrix: {e}")));
    progress.finish();
    let cells = cells?;
    print!("{}", matrix::table(&spec, &cells));
    if let Some(path) = &args.svg {
        let svg = matrix::to_svg(&spec, &cells).map_err(|e| (1, format!("--svg: {e}")))?;
        std::fs::write(path, svg).map_err(|e| (1, format!("--svg {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, matrix::to_csv(&spec, &cells))
            .map_err(|e| (1, format!("--csv {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&matrix::to_json(&spec, &cells)).expect("json");
        std::fs::write(path, text).map_err(|e| (1, format!("--json {}: {e}", path.display())))?;
    }
    if args.verify {
        let checked: u64 = cells.iter().map(|c| c.result.verified_reads).sum();
        let bad: u64 = cells.iter().map(|c| c.result.verify_errors).sum();
        println!("verify: {checked} reads checked, {bad} mismatches");
        if bad > 0 {
            for c in cells.iter().filter(|c| c.result.verify_errors > 0) {
                for r in &c.result.verify_reports {
                    println!(
                        "  {} {} disks={} {}: {r}",
                        c.engine,
                        c.fdmon,
                        c.disks,
                        c.workload.name()
                    );
                }
            }
            return Err((1, format!("verify found {bad} mismatches")));
        }
    }
    Ok(())
}

fn run(args: RunArgs) -> Result<(), (u8, String)> {
    use aio_bench::{jobfile, runner};
    // Parse every file first: a syntax error anywhere stops the run before anything starts.
    let mut files: Vec<jobfile::JobFile> = args
        .jobfiles
        .iter()
        .map(|p| jobfile::load(p))
        .collect::<Result<_, _>>()
        .map_err(|e| (2, e.to_string()))?;
    for note in files.iter().flat_map(|f| &f.notes) {
        eprintln!("note: {note}");
    }
    let device = args.device.map(LoopDevice::attach).transpose()?;
    if let Some(dev) = &device {
        files
            .iter_mut()
            .flat_map(|f| &mut f.jobs)
            .for_each(|def| dev.retarget(def));
    }
    let total: usize = files.iter().map(|f| f.jobs.len()).sum();
    let progress = Progress::new(total as u64, "jobs");
    let mut reports = Vec::new();
    let mut done = 0;
    for f in &files {
        for def in &f.jobs {
            let r = runner::run_one(def);
            done += 1;
            match r {
                Ok(r) => {
                    progress.step(
                        done,
                        format!(
                            "{}: {:.0} IOPS, {:.1} MB/s on {} / {}",
                            def.name,
                            r.result.iops(),
                            r.result.mb_s(),
                            r.engine,
                            r.fdmon
                        ),
                    );
                    reports.push(r);
                }
                Err(e) => {
                    progress.finish();
                    return Err((1, e.to_string()));
                }
            }
        }
    }
    progress.finish();
    if args.output_format == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&runner::to_fio_json(&reports)).expect("json")
        );
    } else {
        print!("{}", runner::to_normal(&reports));
    }
    Ok(())
}

fn latency(mut args: LatencyArgs) -> Result<(), (u8, String)> {
    args.size = args.device.map_or(args.size, |d| d.size);
    let dir = check_target(args.dir.as_deref(), args.bs, args.size, "--size")?;
    let engines: Vec<EngineKind> = if args.engine.is_empty() {
        EngineKind::available()
    } else {
        args.engine.clone()
    };
    let mut polls = vec![0u64, 32_768];
    for &p in &args.poll_max_ns {
        if !polls.contains(&p) {
            polls.push(p);
        }
    }
    let (_device, image) = test_image(&dir, args.size, args.device)?;
    let file = image.file().clone();
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
            let spec = JobSpec {
                ramp: Duration::from_millis(300),
                poll_max_ns,
                ..JobSpec::new(args.rw, args.bs as usize, 1, args.runtime)
            };
            let monitor = args
                .fdmon
                .build()
                .map_err(|e| (1, format!("{}: {e}", args.fdmon)))?;
            let eng = engine.build().map_err(|e| (1, format!("{engine}: {e}")))?;
            let r =
                run_job(monitor, eng, &file, args.size, spec).map_err(|e| (1, e.to_string()))?;
            let p99 = r.total().latency_ns.value_at_quantile(0.99) as f64 / 1000.0;
            print!(" {:>22}", format!("{:.1} ({:.1})", r.mean_lat_us(), p99));
        }
        println!();
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, result) = match cli.command {
        Command::Matrix(args) => ("matrix", matrix(*args)),
        Command::Latency(args) => ("latency", latency(args)),
        Command::VsFio(args) => ("vs-fio", vs_fio(args)),
        Command::Run(args) => ("run", run(args)),
        Command::Probe => {
            print!("{}", aio_bench::probe::report());
            ("probe", Ok(()))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("aio-bench {name}: {msg}");
            ExitCode::from(code)
        }
    }
}
