//! `aio-bench vhost`: drive a vhost-user-blk socket through libblkio (`--socket`), or compare
//! our daemon with qemu-storage-daemon on one image (`--vs-qsd`).
//!
//! This module owns the subcommand's arguments and their checks (all before anything starts:
//! bad input exits 2 naming the flag), the image (`--image`, or the fast device with
//! `--device`) and the one-socket report. The measuring is the library's
//! ([`aio_bench::vhost`]).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aio::EngineKind;
use aio::MonitorKind;
use aio_bench::error::BenchError;
use aio_bench::load::Pattern;
use aio_bench::targets::loopdev::{LoopDevice, LoopSpec};
use aio_bench::units::{parse_duration, parse_poll_max_ns, parse_runtime, parse_size};
use aio_bench::vhost::compare::{self, CompareSpec};
use aio_bench::vhost::daemons::QSD;
use aio_bench::vhost::MAX_IODEPTH;
use aio_bench::vhost::{run_client, ClientResult, ClientSpec};

use super::values::parse_monitor_or_auto;

/// The environment variable naming another program to run as our daemon (tests).
pub const DAEMON_ENV: &str = "AIO_BENCH_VHOST_DAEMON";

/// The longest socket path (`sun_path` holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// `aio-bench vhost`'s arguments.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["socket", "vs_qsd"])))]
pub struct VhostArgs {
    /// Drive the vhost-user-blk socket of a daemon already running.
    #[arg(long, conflicts_with = "vs_qsd")]
    pub socket: Option<PathBuf>,
    /// With --socket: the daemon's PID, to report its CPU time per request.
    #[arg(long, requires = "socket")]
    pub daemon_pid: Option<u32>,
    /// Start qemu-storage-daemon and ours (`aio-bench vhost-daemon`) on one image, one at a
    /// time, alternating, and compare them (needs --image or --device).
    #[arg(long)]
    pub vs_qsd: bool,
    /// With --vs-qsd: the image both daemons serve (a file or a block device; it is written
    /// to with writes).
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// With --vs-qsd: the image on the fast device, `loop` or `loop:SIZE` (default 512m), a
    /// loop device with direct I/O over a file in /dev/shm (needs root).
    #[arg(long, conflicts_with = "image")]
    pub device: Option<LoopSpec>,
    /// randread, randwrite, randrw (or read, write, rw).
    #[arg(long, default_value = "randread")]
    pub rw: Pattern,
    /// Percentage of reads with randrw and rw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,
    /// Block size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// Requests in flight per queue.
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=MAX_IODEPTH as u64))]
    pub iodepth: u64,
    /// Virtqueues driven (one client thread each); with --vs-qsd also each disk's queues.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub queues: u64,
    /// Measured time per run.
    #[arg(long, default_value = "5s", value_parser = parse_runtime)]
    pub runtime: Duration,
    /// Warm-up before it, per run.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Stamp every block written with its offset and a generation, check every block read; a
    /// mismatch fails the run (exit code 1).
    #[arg(long)]
    pub verify: bool,
    /// Pin the client threads to this CPU (with --vs-qsd default 1).
    #[arg(long)]
    pub client_cpu: Option<usize>,
    /// With --vs-qsd: A B pairs to run.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: Option<u64>,
    /// With --vs-qsd: uring, linux-aio or pool for ours, QEMU's aio=io_uring, native or
    /// threads (default uring).
    #[arg(long)]
    pub engine: Option<EngineKind>,
    /// With --vs-qsd: both iothreads' adaptive polling limit (default 32768, QEMU's); `auto`
    /// gives ours the automatic window and qemu-storage-daemon its default.
    #[arg(long, value_parser = parse_poll_max_ns)]
    pub poll_max_ns: Option<aio_loop::PollMaxNs>,
    /// With --vs-qsd: disk counts, comma-separated (the scsi-disk scaling test: N disks on
    /// each daemon's one iothread, the first driven; default 1).
    #[arg(long, value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub disks: Vec<u64>,
    /// With --vs-qsd: our fd monitors, comma-separated, a run of ours each (poll, epoll,
    /// hybrid, uring or auto; default auto, and epoll,hybrid,uring with --disks).
    #[arg(long, value_delimiter = ',', value_parser = parse_monitor_or_auto)]
    pub fdmon: Vec<MonitorKind>,
    /// With --vs-qsd: pin both daemons (all their threads) to this CPU (default 0).
    #[arg(long)]
    pub daemon_cpu: Option<usize>,
}

/// Runs `vhost`.
pub fn run(args: VhostArgs) -> Result<(), BenchError> {
    check_mode(&args)?;
    let mut client = client_spec(&args)?;
    if let Some(socket) = &args.socket {
        return one_socket(socket, &client, &args);
    }
    client.cpu = Some(args.client_cpu.unwrap_or(1));
    check_cpu("--client-cpu", client.cpu)?;
    let daemon_cpu = Some(args.daemon_cpu.unwrap_or(0));
    check_cpu("--daemon-cpu", daemon_cpu)?;
    let image_file = match &args.image {
        Some(image) => Some((image.clone(), check_image(image, client.bs)?)),
        None => None,
    };
    check_qsd()?;
    // The program run as our daemon: this binary (`aio-bench vhost-daemon ARGS`), or for
    // tests the one AIO_BENCH_VHOST_DAEMON names (run with the same arguments).
    let exe = match std::env::var_os(DAEMON_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .map_err(|e| BenchError::io("finding the aio-bench binary (for our daemon)", e))?,
    };
    let scaling = !args.disks.is_empty();
    let fdmons = if !args.fdmon.is_empty() {
        args.fdmon.clone()
    } else if scaling {
        let have = MonitorKind::available();
        [MonitorKind::Epoll, MonitorKind::Hybrid, MonitorKind::Uring]
            .into_iter()
            .filter(|m| have.contains(m))
            .collect()
    } else {
        vec![
            MonitorKind::auto()
                .map_err(|e| BenchError::failed(format!("--fdmon auto: {e}")))?
                .kind,
        ]
    };
    let (_device, image, block_device) = match (image_file, args.device) {
        (Some((image, block_device)), None) => (None, image, block_device),
        (None, Some(spec)) => {
            let dev = LoopDevice::attach(spec)?;
            let path = dev.path().to_path_buf();
            (Some(dev), path, true)
        }
        _ => {
            return Err(BenchError::bad_input(
                "--vs-qsd needs the image: --image PATH or --device loop[:SIZE]",
            ))
        }
    };
    let spec = CompareSpec {
        image,
        block_device,
        engine: args.engine.unwrap_or(EngineKind::Uring),
        poll_max_ns: args
            .poll_max_ns
            .unwrap_or(aio_loop::PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS)),
        rounds: args.rounds.unwrap_or(2) as usize,
        disks: if scaling {
            args.disks.iter().map(|&d| d as usize).collect()
        } else {
            vec![1]
        },
        fdmons,
        daemon_cpu,
        client,
        exe,
    };
    Ok(compare::run(&spec)?)
}

/// With `--socket`, no flag of `--vs-qsd`'s (clap's `requires` cannot tell a flag's default
/// from the flag given).
fn check_mode(args: &VhostArgs) -> Result<(), BenchError> {
    if args.vs_qsd {
        return Ok(());
    }
    let given = [
        ("--image", args.image.is_some()),
        ("--device", args.device.is_some()),
        ("--rounds", args.rounds.is_some()),
        ("--engine", args.engine.is_some()),
        ("--poll-max-ns", args.poll_max_ns.is_some()),
        ("--disks", !args.disks.is_empty()),
        ("--fdmon", !args.fdmon.is_empty()),
        ("--daemon-cpu", args.daemon_cpu.is_some()),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((flag, _)) => Err(BenchError::bad_input(format!(
            "{flag} needs --vs-qsd (with --socket the daemon is already running)"
        ))),
        None => Ok(()),
    }
}

/// The client's part of the arguments, checked.
fn client_spec(args: &VhostArgs) -> Result<ClientSpec, BenchError> {
    if args.rw.is_trim() {
        return Err(BenchError::bad_input(format!(
            "--rw {}: vhost runs randread, randwrite, randrw, read, write or rw",
            args.rw
        )));
    }
    if args.bs == 0 || args.bs % 512 != 0 || args.bs > 16 << 20 {
        return Err(BenchError::bad_input(format!(
            "--bs {}: must be a non-zero multiple of 512, at most 16m",
            args.bs
        )));
    }
    check_cpu("--client-cpu", args.client_cpu)?;
    Ok(ClientSpec {
        rw: args.rw,
        rwmixread: args.rwmixread,
        bs: args.bs as usize,
        iodepth: args.iodepth as usize,
        queues: args.queues as usize,
        runtime: args.runtime,
        ramp: args.ramp,
        verify: args.verify,
        cpu: args.client_cpu,
    })
}

/// `--socket`: one run against a daemon already running, and its report.
fn one_socket(socket: &Path, client: &ClientSpec, args: &VhostArgs) -> Result<(), BenchError> {
    let is_socket = std::fs::metadata(socket).is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return Err(BenchError::bad_input(format!(
            "--socket {}: not an existing socket",
            socket.display()
        )));
    }
    if let Some(pid) = args.daemon_pid {
        aio::process::cpu_time(pid).map_err(|e| {
            BenchError::bad_input(format!("--daemon-pid {pid}: no such process ({e})"))
        })?;
    }
    let r = run_client(socket, client, args.daemon_pid)?;
    println!(
        "vhost-user-blk {} ({} MiB) via libblkio: {} bs={} iodepth={} queues={}{}, {:?} after a \
         {:?} ramp{}",
        socket.display(),
        r.capacity >> 20,
        client.rw,
        client.bs,
        client.iodepth,
        client.queues,
        if client.verify { ", verify" } else { "" },
        client.runtime,
        client.ramp,
        client
            .cpu
            .map_or(String::new(), |c| format!(", client on CPU {c}"))
    );
    print_result(&r, args.daemon_pid, client.verify);
    Ok(())
}

/// The one-socket report.
fn print_result(r: &ClientResult, pid: Option<u32>, verify: bool) {
    println!(
        "  IOPS {:.0}, {:.1} MB/s ({} requests, {} reads)",
        r.iops(),
        r.mb_s(),
        r.requests,
        r.reads
    );
    println!(
        "  latency µs: mean {:.1}, p50 {:.1}, p99 {:.1}",
        r.mean_us(),
        r.percentile_us(50.0),
        r.percentile_us(99.0)
    );
    match (pid, r.cpu_per_request_us(), r.daemon_cpu) {
        (Some(pid), Some(per), Some(cpu)) => println!(
            "  daemon (PID {pid}) CPU: {:.3} s, {per:.2} µs per request",
            cpu.as_secs_f64()
        ),
        _ => println!("  daemon CPU: - (give --daemon-pid PID)"),
    }
    if verify {
        println!(
            "  verify (ramp included): {} writes stamped, {} reads checked, {} reads of blocks \
             not written in this run held no stamp; no mismatch",
            r.stamped_writes, r.verified_reads, r.unstamped_reads
        );
    }
}

/// A CPU flag: a CPU this process may run on.
fn check_cpu(flag: &str, cpu: Option<usize>) -> Result<(), BenchError> {
    let Some(c) = cpu else { return Ok(()) };
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .ok()
        .and_then(|set| set.is_set(c).ok())
        .unwrap_or(false);
    if !allowed {
        return Err(BenchError::bad_input(format!(
            "{flag} {c}: not a CPU this process may run on"
        )));
    }
    Ok(())
}

/// qemu-storage-daemon can be run.
fn check_qsd() -> Result<(), BenchError> {
    match std::process::Command::new(QSD)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(BenchError::bad_input(format!(
            "--vs-qsd: `{QSD} --version` failed ({s})"
        ))),
        Err(e) => Err(BenchError::bad_input(format!(
            "--vs-qsd: {QSD} cannot be run ({e}); it is in Debian's qemu-system-common"
        ))),
    }
}

/// `--image`: an existing file or block device of at least one block, with a path both
/// daemons' option syntax takes; returns whether it is a block device.
fn check_image(image: &Path, bs: usize) -> Result<bool, BenchError> {
    let bad = |why: String| {
        Err(BenchError::bad_input(format!(
            "--image {}: {why}",
            image.display()
        )))
    };
    let meta = match std::fs::metadata(image) {
        Ok(m) => m,
        Err(e) => return bad(e.to_string()),
    };
    let block_device = meta.file_type().is_block_device();
    if !block_device && !meta.is_file() {
        return bad("not a file or a block device".into());
    }
    if !block_device && meta.len() < bs as u64 {
        return bad(format!("{} bytes, smaller than --bs {bs}", meta.len()));
    }
    if image.to_string_lossy().contains(',') {
        return bad("the path has a comma (both daemons' options split at commas)".into());
    }
    let sock_len = std::env::temp_dir()
        .join(format!(
            "aio-bench-vhost-{}/qemu-255.sock",
            std::process::id()
        ))
        .as_os_str()
        .len();
    if sock_len > MAX_SOCKET_PATH {
        return Err(BenchError::bad_input(format!(
            "TMPDIR {}: too long for a socket path",
            std::env::temp_dir().display()
        )));
    }
    Ok(block_device)
}
