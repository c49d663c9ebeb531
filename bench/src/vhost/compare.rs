//! `aio-bench vhost --vs-qsd`: our daemon beside qemu-storage-daemon on the same image, the
//! same CPUs and the same client, one daemon at a time, alternating (QEMU, ours, QEMU, ours,
//! ...) round after round; then the medians over the rounds and the ratios ours/QEMU for mean
//! latency, IOPS and daemon CPU time per request.
//!
//! With several disk counts (`--disks 1,16,64`: the scsi-disk scaling test over vhost-user),
//! each daemon serves N disks (N sockets on the one image, all on its one iothread) and the
//! client drives the first; each count is also compared with the smallest. Ours runs once per
//! fd monitor given.
//!
//! This module owns the schedule of runs and the report; [`super::daemons`] starts and stops
//! the daemons, [`super::client`] measures.

use std::path::PathBuf;

use aio::EngineKind;
use aio::MonitorKind;

use super::client::{run_client, ClientResult};
use super::daemons::{qemu_aio, Daemon, DaemonKind, DaemonSpec, RunDir};
use super::error::VhostError;
use super::spec::ClientSpec;
use crate::rounds::median;

/// What `--vs-qsd` runs.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    /// The image both daemons serve (a file, or a block device).
    pub image: PathBuf,
    /// The image is a block device.
    pub block_device: bool,
    /// The kind of I/O (QEMU's `aio=` to match, [`qemu_aio`]).
    pub engine: EngineKind,
    /// Both iothreads' `poll-max-ns`.
    pub poll_max_ns: aio_loop::PollMaxNs,
    /// A B pairs.
    pub rounds: usize,
    /// Disk counts (each daemon serves N disks, the client drives the first).
    pub disks: Vec<usize>,
    /// Our fd monitors, one run of ours per round each.
    pub fdmons: Vec<MonitorKind>,
    /// The daemons' CPU.
    pub daemon_cpu: Option<usize>,
    /// The client (its `cpu`: the client threads' CPU, its `queues`: each disk's queues).
    pub client: ClientSpec,
    /// The `aio-bench` binary, re-executed as `aio-bench vhost-daemon` for ours.
    pub exe: PathBuf,
}

/// One daemon at one disk count: its runs, round after round.
#[derive(Debug)]
struct Cell {
    disks: usize,
    kind: DaemonKind,
    runs: Vec<ClientResult>,
}

/// The medians of a cell's runs.
#[derive(Debug, Clone, Copy)]
struct Medians {
    iops: f64,
    mb_s: f64,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
}

impl Cell {
    /// Each figure's median over the runs.
    fn medians(&self) -> Medians {
        let runs: Vec<Medians> = self.runs.iter().map(medians_of).collect();
        let m = |f: fn(&Medians) -> f64| {
            median(&runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
        };
        Medians {
            iops: m(|r| r.iops),
            mb_s: m(|r| r.mb_s),
            mean_us: m(|r| r.mean_us),
            p50_us: m(|r| r.p50_us),
            p99_us: m(|r| r.p99_us),
            cpu_us: m(|r| r.cpu_us),
        }
    }
}

/// Runs the comparison and prints each run and the summary. The first daemon that fails (to
/// start, or during its run) ends it with that daemon's error; nothing is left running.
pub fn run(spec: &CompareSpec) -> Result<(), VhostError> {
    let dir = RunDir::new()?;
    let c = &spec.client;
    println!(
        "vhost-user-blk: ours vs {} on {} ({}), engine {} (QEMU aio={}), poll-max-ns {}",
        super::daemons::QSD,
        spec.image.display(),
        if spec.block_device {
            "block device"
        } else {
            "file"
        },
        spec.engine.name(),
        qemu_aio(spec.engine),
        spec.poll_max_ns
    );
    println!(
        "client: libblkio virtio-blk-vhost-user, {} bs={} iodepth={} queues={}{}, {:?} after a \
         {:?} ramp, {} round(s); daemon on CPU {}, client on CPU {}",
        c.rw,
        c.bs,
        c.iodepth,
        c.queues,
        if c.verify { ", verify" } else { "" },
        c.runtime,
        c.ramp,
        spec.rounds,
        cpu_name(spec.daemon_cpu),
        cpu_name(c.cpu)
    );
    let mut kinds = vec![DaemonKind::Qemu];
    kinds.extend(spec.fdmons.iter().map(|&m| DaemonKind::Ours(m)));
    let mut cells: Vec<Cell> = spec
        .disks
        .iter()
        .flat_map(|&disks| {
            kinds.iter().map(move |&kind| Cell {
                disks,
                kind,
                runs: Vec::new(),
            })
        })
        .collect();
    for round in 0..spec.rounds {
        println!("\nround {}/{}:", round + 1, spec.rounds);
        header();
        for i in crate::rounds::order(round, cells.len()) {
            let cell = &mut cells[i];
            let daemon = DaemonSpec {
                kind: cell.kind,
                image: spec.image.clone(),
                block_device: spec.block_device,
                engine: spec.engine,
                poll_max_ns: spec.poll_max_ns,
                queues: c.queues,
                disks: cell.disks,
                cpu: spec.daemon_cpu,
            };
            let r = one_run(&daemon, dir.path(), spec)?;
            row(cell.disks, &cell.kind.label(), &medians_of(&r));
            cell.runs.push(r);
        }
    }
    summary(spec, &cells);
    Ok(())
}

/// Starts the daemon, runs the client on its first disk, checks it is still alive and stops
/// it.
fn one_run(
    daemon: &DaemonSpec,
    dir: &std::path::Path,
    spec: &CompareSpec,
) -> Result<ClientResult, VhostError> {
    let mut d = Daemon::start(daemon, dir, &spec.exe)?;
    let result = run_client(d.socket(0), &spec.client, Some(d.pid()));
    // A daemon that died explains a failed run better than the client's error does.
    d.check_running()?;
    let result = result.map_err(|e| VhostError::failed(format!("{}: {e}", d.label())))?;
    d.stop()?;
    Ok(result)
}

/// One run's figures as a row.
fn medians_of(r: &ClientResult) -> Medians {
    Medians {
        iops: r.iops(),
        mb_s: r.mb_s(),
        mean_us: r.mean_us(),
        p50_us: r.percentile_us(50.0),
        p99_us: r.percentile_us(99.0),
        cpu_us: r.cpu_per_request_us().unwrap_or(f64::NAN),
    }
}

fn cpu_name(cpu: Option<usize>) -> String {
    cpu.map_or("any".into(), |c| c.to_string())
}

/// The columns of a run's row (the summary adds the ratios after them).
fn header_text() -> String {
    format!(
        "  {:>5}  {:<12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "disks", "daemon", "IOPS", "MB/s", "mean µs", "p50 µs", "p99 µs", "CPU/req µs"
    )
}

fn header() {
    println!("{}", header_text());
}

/// A row of figures.
fn row_text(disks: usize, label: &str, m: &Medians) -> String {
    format!(
        "  {:>5}  {:<12} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>11.2}",
        disks, label, m.iops, m.mb_s, m.mean_us, m.p50_us, m.p99_us, m.cpu_us
    )
}

fn row(disks: usize, label: &str, m: &Medians) {
    println!("{}", row_text(disks, label, m));
}

/// `a / b`, printed as a ratio (`-` when either is missing).
fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b != 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

/// The medians over the rounds, the ratios ours/QEMU at each disk count and, with several
/// counts, each count against the smallest.
fn summary(spec: &CompareSpec, cells: &[Cell]) {
    println!(
        "\nmedians over {} round(s); ours/qemu: below 1 is better for latency and CPU, above 1 \
         for IOPS",
        spec.rounds
    );
    let scaling = spec.disks.len() > 1;
    let base_disks = spec.disks.iter().copied().min().unwrap_or(1);
    print!(
        "{} | {:>9} {:>9} {:>9}",
        header_text(),
        "lat/qemu",
        "IOPS/qemu",
        "CPU/qemu"
    );
    if scaling {
        print!(
            " | {:>9} {:>9}",
            format!("IOPS/{base_disks}d"),
            format!("lat/{base_disks}d")
        );
    }
    println!();
    for cell in cells {
        let m = cell.medians();
        let qemu = cells
            .iter()
            .find(|c| c.disks == cell.disks && c.kind == DaemonKind::Qemu)
            .map(Cell::medians);
        let (lat_r, iops_r, cpu_r) = match (cell.kind, qemu) {
            (DaemonKind::Ours(_), Some(q)) => (
                ratio(m.mean_us, q.mean_us),
                ratio(m.iops, q.iops),
                ratio(m.cpu_us, q.cpu_us),
            ),
            _ => ("".into(), "".into(), "".into()),
        };
        print!(
            "{} | {lat_r:>9} {iops_r:>9} {cpu_r:>9}",
            row_text(cell.disks, &cell.kind.label(), &m)
        );
        if scaling {
            let base = cells
                .iter()
                .find(|c| c.disks == base_disks && c.kind == cell.kind)
                .map(Cell::medians);
            match base {
                Some(b) => print!(
                    " | {:>9} {:>9}",
                    ratio(m.iops, b.iops),
                    ratio(m.mean_us, b.mean_us)
                ),
                None => print!(" | {:>9} {:>9}", "-", "-"),
            }
        }
        println!();
    }
}
