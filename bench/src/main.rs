//! `aio-bench`: compare aio-rs backends, and compare them with fio.
//!
//! Subcommands: `matrix` (the scsi-disk scaling test from the QEMU epoll discussion, 1..256
//! disks on one IOThread), `latency` (QD1 latency per engine, the measurement of QEMU's
//! thread-pool notifier/io_poll change: polling off, at QEMU's default, and at given values),
//! `run` (fio job files, reported in fio's formats), `vs-fio` (the same job through fio and
//! through one of our engines, alternating A B / B A) and `probe` (which backends this build
//! and kernel offer, and what `auto` picks), `vhost` (a vhost-user-blk socket driven through
//! libblkio, and our daemon beside qemu-storage-daemon; the hidden `vhost-daemon` is our daemon
//! itself, which `vhost --vs-qsd` starts).
//!
//! This file is the command line only: its clap structs and the dispatch. Each subcommand is a
//! module of [`cmd`]; every one returns [`aio_bench::error::BenchError`], and `main` alone
//! prints the error and exits with its code.

mod cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aio::{EngineKind, MonitorKind, Pairing};
use aio_bench::cpus::CpuList;
use aio_bench::load::Pattern;
use aio_bench::matrix::Workload;
use aio_bench::targets::loopdev::LoopSpec;
use aio_bench::units::{parse_duration, parse_poll_max_ns, parse_runtime, parse_size};
use aio_loop::PollMaxNs;
use clap::{Parser, Subcommand};

use crate::cmd::values::{parse_engine_or_auto, parse_monitor, parse_monitor_or_auto};

#[derive(Parser, Debug)]
#[command(name = "aio-bench", version, about = "Benchmarks for aio-rs backends")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The scsi-disk scaling matrix (the QEMU epoll discussion's test): MB/s as 1..256 disks
    /// share one iothread (or K, `--iothreads`).
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
    /// Drive a vhost-user-blk socket through libblkio (`--socket`), or compare our daemon with
    /// qemu-storage-daemon on one image, alternating (`--vs-qsd`).
    Vhost(Box<cmd::vhost::VhostArgs>),
    /// Our vhost-user-blk daemon (what `vhost --vs-qsd` starts): every argument goes to
    /// `aio_storage_daemon::cli::main`, and its exit code is ours.
    #[command(hide = true, disable_help_flag = true)]
    VhostDaemon(VhostDaemonArgs),
}

#[derive(clap::Args, Debug)]
struct VhostDaemonArgs {
    /// The daemon's own arguments (`--disk socket=PATH,image=PATH ...`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// fio job files (`[global]` and job sections; see `aio_bench::fio::jobfile` for the options).
    #[arg(required = true)]
    jobfiles: Vec<PathBuf>,
    /// `normal` (fio's text summary) or `json` (fio's JSON field names).
    #[arg(long, default_value = "normal", value_parser = ["normal", "json"])]
    output_format: String,
    /// Run every job on the fast device, `loop` or `loop:SIZE` (default 512m): a loop device
    /// with direct I/O over a file in /dev/shm (needs root). Replaces the jobs' `filename=` and
    /// `directory=`; their `size=` is limited to the device's.
    #[arg(long)]
    device: Option<LoopSpec>,
}

#[derive(clap::Args, Debug)]
struct VsFioArgs {
    /// Our engine: pool, linux-aio or uring (compared with fio's psync, libaio or io_uring).
    #[arg(long, default_value = "linux-aio")]
    engine: EngineKind,
    /// read, write, randread, randwrite, rw or randrw (mixed 50/50).
    #[arg(long, default_value = "randread")]
    rw: Pattern,
    /// Block size (fio units: 4k, 64k, 1m).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    iodepth: u64,
    /// Measured time per run (10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_runtime)]
    runtime: Duration,
    /// Warm-up before measuring, per run.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ramp: Duration,
    /// The test file or the fast device, for fio and ours alike.
    #[command(flatten)]
    target: TestTarget,
    /// A B pairs to run (B A in every second round).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
    /// Our fd monitor; `shared-ring` (with `--engine uring`): one io_uring for the fd monitor
    /// and the engine, so completions need no eventfd.
    #[arg(long, default_value = "epoll")]
    fdmon: Pairing,
    /// Our loop's adaptive polling limit in ns (0 = off, as fio's libaio engine waits in the
    /// kernel), or `auto` (the window chosen from the waits the loop sees).
    #[arg(long, default_value = "0", value_parser = parse_poll_max_ns)]
    poll_max_ns: PollMaxNs,
    /// Our engine's largest batch per submission (default: the engine's, 32). Requests that
    /// completion callbacks resubmit go out whenever a batch is full; a batch is never larger
    /// than what the kernel already holds (aio-core's batch rule).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    max_batch: Option<u64>,
}

/// One O_DIRECT test target: a file, or the whole fast device (`vs-fio`, `latency`).
#[derive(clap::Args, Debug)]
struct TestTarget {
    /// Directory for the test file (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of the test file.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    size: u64,
    /// The fast device instead of the test file: `loop` or `loop:SIZE` (default 512m), a loop
    /// device with direct I/O over a file in /dev/shm (needs root).
    #[arg(long, conflicts_with_all = ["dir", "size"])]
    device: Option<LoopSpec>,
}

#[derive(clap::Args, Debug)]
#[command(mut_arg("size", |a| a.default_value("64m")))]
struct LatencyArgs {
    /// Engines, comma-separated. Default: all this build has.
    #[arg(long, value_delimiter = ',')]
    engine: Vec<EngineKind>,
    /// poll_max_ns values beyond 0 and 32768, comma-separated (ns, or `auto`).
    #[arg(long, value_delimiter = ',', value_parser = parse_poll_max_ns)]
    poll_max_ns: Vec<PollMaxNs>,
    /// read, write, randread, randwrite, rw or randrw (mixed 50/50).
    #[arg(long, default_value = "randread")]
    rw: Pattern,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Measured time per cell.
    #[arg(long, default_value = "3s", value_parser = parse_runtime)]
    runtime: Duration,
    /// The test file (64 MiB by default) or the fast device.
    #[command(flatten)]
    target: TestTarget,
    /// Our fd monitor.
    #[arg(long, default_value = "epoll", value_parser = parse_monitor)]
    fdmon: MonitorKind,
    /// Runs of every cell, alternated (each round runs every engine at every setting once);
    /// the table shows the median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    repeat: u64,
    /// After the table, one line per cell: the spread of the mean over the runs (max / min),
    /// the loop thread's CPU per request, the share of its time spent busy polling and
    /// polling for nothing, and the window the loop ended with.
    #[arg(long)]
    detail: bool,
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
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Requests in flight per driven disk.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    iodepth: u64,
    /// Drive one disk (the QEMU epoll discussion's setup) or all of them.
    #[arg(long, default_value = "one", value_parser = ["one", "all"])]
    active: String,
    /// Measured time per cell.
    #[arg(long, default_value = "1s", value_parser = parse_runtime)]
    runtime: Duration,
    /// Warm-up per cell.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    ramp: Duration,
    /// Directory for the disk images (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of each driven disk's image.
    #[arg(long, default_value = "64m", value_parser = parse_size)]
    disk_size: u64,
    /// The disks on the fast device instead of image files: `loop` or `loop:SIZE` (default
    /// 512m), a loop device with direct I/O over a file in /dev/shm (needs root); each disk
    /// gets its own fd and SIZE / disks of it.
    #[arg(long, conflicts_with_all = ["dir", "disk_size"])]
    device: Option<LoopSpec>,
    /// The iothread's adaptive polling limit in ns (QEMU's IOThread default), or `auto`.
    #[arg(long, default_value = "32768", value_parser = parse_poll_max_ns)]
    poll_max_ns: PollMaxNs,
    /// How long an idle disk stays in the poll set. QEMU uses 7 s; the matrix's cells are
    /// short, so the default (100ms, shorter than the ramp) measures the steady state in which
    /// idle disks have left it, as they would in a long-running QEMU.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
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
    /// Run every cell this many times, round after round (every second one backwards), and
    /// report each cell's median run:
    /// steadier figures on a noisy machine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    repeat: u64,
    /// Stamp every block written with its offset, a generation and a crc32c, and check every
    /// block read; report mismatches with their disk and offset (exit code 1 if any).
    #[arg(long)]
    verify: bool,
    /// Copy each request's data between guest RAM and the iothread's own aligned buffers
    /// (QEMU's bounce buffers) instead of pointing the engine into guest RAM: the copy path,
    /// for comparison. Reports say which path ran (`memory`: `guest` or `bounce`).
    #[arg(long)]
    bounce: bool,
    /// Run the bench on these CPUs (`0`, `0,1`, `0-3`), as `taskset` would. Iothread t (of K)
    /// is pinned to the list's CPU number t mod len, and the thread pool's workers run on the
    /// CPU of the iothread that started them; the guests run on the CPUs of the list no
    /// iothread has, or on the whole list if the iothreads take all of it. With `0,1`: K = 1
    /// puts the iothread on CPU 0 and the guests on CPU 1, K = 2 the iothreads on CPUs 0 and 1
    /// and the guests on both. On a small VM, `--cpus 0` keeps the scheduler from moving the
    /// guest and the iothread between vCPUs, the largest source of noise.
    #[arg(long)]
    cpus: Option<CpuList>,
    /// Iothread counts, comma-separated (1..=64; default 1): each cell runs with K iothreads,
    /// each with its own context, fd monitor and engine built on its thread, the disks spread
    /// round-robin over them (QEMU's iothread-vq-mapping: queue q of disk d on iothread
    /// (d * queues + q) mod K). A list (`1,2`) runs every count, alternating within each round,
    /// and `--svg` adds MB/s against iothreads.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=64))]
    iothreads: Vec<u64>,
    /// Virtqueues per disk (1..=64), each with its own kick, used ring and interrupt, spread
    /// over the iothreads as `--iothreads` says; a disk's guest puts slot s on queue
    /// s mod Q.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    queues: u64,
    /// How the guest threads are scheduled: `normal` (SCHED_OTHER, as QEMU's vCPUs run: a
    /// guest woken by its interrupt may preempt the iothread on its CPU) or `batch`
    /// (SCHED_BATCH: it waits until that iothread sleeps or its slice ends). Matters only where
    /// guests and iothreads share CPUs (`--cpus 0,1 --iothreads 2`).
    #[arg(long, default_value = "normal")]
    guest_sched: aio_bench::scsi::GuestSched,
}

impl Command {
    /// The subcommand's name, as typed and as its error messages begin.
    fn name(&self) -> &'static str {
        match self {
            Command::Matrix(_) => "matrix",
            Command::Latency(_) => "latency",
            Command::VsFio(_) => "vs-fio",
            Command::Run(_) => "run",
            Command::Probe => "probe",
            Command::Vhost(_) => "vhost",
            Command::VhostDaemon(_) => "vhost-daemon",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let name = cli.command.name();
    let result = match cli.command {
        Command::Matrix(args) => cmd::matrix::run(*args),
        Command::Latency(args) => cmd::latency::run(args),
        Command::VsFio(args) => cmd::vs_fio::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Probe => cmd::probe::run(),
        Command::Vhost(args) => cmd::vhost::run(*args),
        Command::VhostDaemon(args) => std::process::exit(aio_storage_daemon::cli::main(args.args)),
    };
    // The one place that prints an error and exits with its code (BenchError::exit_code).
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aio-bench {name}: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
