//! The scsi-disk scaling matrix: fd monitors x engines x disk counts x workloads x iothread
//! counts, and its terminal table, CSV, SVG and JSON.
//!
//! This module owns the axes, the order cells run in, and the report formats. Each cell is
//! [`scsi::run_cell_on_iothreads`](crate::scsi::run_cell_on_iothreads): K iothreads, each
//! building its own fd monitor and engine on itself, the disks' queues spread over them.

mod report;
mod scaling;

use std::io;
use std::path::Path;

pub use self::report::{table, to_csv, to_json, to_svg};
pub use self::scaling::{ceiling, scaling, scaling_table, Scaling};

use crate::load::Pattern;
use crate::scsi::{run_cell_on_iothreads, CellResult, CellSpec};
use crate::targets::image::DiskImage;
use aio::MonitorKind;
use aio::{EngineKind, EngineOptions};

/// A workload of the matrix (the columns of the QEMU epoll discussion's scsi-disk table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Sequential reads (fio `rw=read`).
    Rd,
    /// Sequential writes (fio `rw=write`).
    Wr,
    /// Random reads and writes, 50/50 (fio `rw=randrw`).
    RandRw,
}

impl Workload {
    /// Every workload, in table order.
    pub const ALL: [Workload; 3] = [Workload::Rd, Workload::Wr, Workload::RandRw];

    /// The guest's fio pattern.
    pub fn pattern(self) -> Pattern {
        match self {
            Workload::Rd => Pattern::Read,
            Workload::Wr => Pattern::Write,
            Workload::RandRw => Pattern::RandReadWrite,
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Rd => "rd",
            Workload::Wr => "wr",
            Workload::RandRw => "randrw",
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| format!("unknown workload '{s}' (expected rd, wr or randrw)"))
    }
}

/// The axes and the per-cell job.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixSpec {
    /// Fd monitors.
    pub fdmons: Vec<MonitorKind>,
    /// Engines.
    pub engines: Vec<EngineKind>,
    /// Disk counts.
    pub disks: Vec<usize>,
    /// Workloads.
    pub workloads: Vec<Workload>,
    /// Drive every disk (`all`) or only the first (`one`, the QEMU epoll discussion's setup).
    pub active_all: bool,
    /// The per-disk job (pattern is set per workload).
    pub cell: CellSpec,
    /// Size of each driven disk's image.
    pub disk_size: u64,
    /// Rounds: every cell runs this many times, round after round (so slow drift of the
    /// machine touches every cell alike), and reports its median run by MB/s.
    pub repeat: usize,
    /// Iothread counts (K), each at least 1: every cell runs with each, the disks' queues
    /// spread over K iothreads ([`crate::scsi::iothread_of`]). Innermost axis, so that within a
    /// round the counts alternate (A B A B).
    pub iothreads: Vec<usize>,
    /// CPUs to pin the iothreads to (iothread `t` on `cpus[t % len]`,
    /// [`crate::cpus::iothread_cpu`]); empty: not pinned.
    pub cpus: Vec<usize>,
}

impl MatrixSpec {
    /// The quick matrix, `aio-bench matrix`'s default: every fd monitor and engine this build
    /// and kernel offer (see [`MatrixSpec::quick_over`]).
    pub fn quick() -> MatrixSpec {
        MatrixSpec::quick_over(MonitorKind::available(), EngineKind::available())
    }

    /// The quick matrix over `fdmons` and `engines`: 1, 16 and 256 disks, workloads rd and
    /// randrw, one active disk, the quick cell ([`CellSpec::quick`]: 4 KiB blocks at iodepth
    /// 8, 200 ms ramp and 1 s per cell, QEMU's IOThread polling, one queue per disk), 64 MiB
    /// images, one round, one iothread, not pinned.
    pub fn quick_over(fdmons: Vec<MonitorKind>, engines: Vec<EngineKind>) -> MatrixSpec {
        MatrixSpec {
            fdmons,
            engines,
            disks: vec![1, 16, 256],
            workloads: vec![Workload::Rd, Workload::RandRw],
            active_all: false,
            cell: CellSpec::quick(),
            disk_size: 64 << 20,
            repeat: 1,
            iothreads: vec![1],
            cpus: Vec::new(),
        }
    }

    /// This matrix over the full matrix's disk counts (1, 4, 8, 16, 32, 64, 128 and 256) and
    /// all three workloads: `aio-bench matrix --full`.
    pub fn full(self) -> MatrixSpec {
        MatrixSpec {
            disks: vec![1, 4, 8, 16, 32, 64, 128, 256],
            workloads: Workload::ALL.to_vec(),
            ..self
        }
    }

    /// How many cells the matrix has.
    pub fn cell_count(&self) -> usize {
        self.fdmons.len()
            * self.engines.len()
            * self.disks.len()
            * self.workloads.len()
            * self.iothreads.len()
    }

    /// How many cell runs the matrix makes (cells x rounds).
    pub fn run_count(&self) -> usize {
        self.cell_count() * self.repeat.max(1)
    }

    /// The largest disk count: how many disks (images) the matrix needs.
    pub fn max_disks(&self) -> usize {
        self.disks.iter().copied().max().unwrap_or(1)
    }

    /// Whether disk `i` is driven in some cell (the first always; all with `active_all`).
    pub fn is_driven(&self, i: usize) -> bool {
        self.active_all || i == 0
    }

    /// Whether disk `i` must be stamped for `--verify` (driven disks, when verifying).
    pub fn is_stamped(&self, i: usize) -> bool {
        self.cell.verify && self.is_driven(i)
    }
}

/// One measured cell.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Fd monitor.
    pub fdmon: MonitorKind,
    /// Engine.
    pub engine: EngineKind,
    /// Disks attached.
    pub disks: usize,
    /// Workload.
    pub workload: Workload,
    /// Iothreads (K).
    pub iothreads: usize,
    /// Virtqueues per disk (Q).
    pub queues: usize,
    /// What it measured (the median round's run).
    pub result: CellResult,
    /// Every round's MB/s, in round order (one with `repeat` 1).
    pub rounds_mb_s: Vec<f64>,
}

impl Cell {
    /// MB/s (10^6 bytes per second).
    pub fn mb_s(&self) -> f64 {
        self.result.bytes as f64 / 1e6 / self.result.elapsed.as_secs_f64()
    }

    /// IOPS.
    pub fn iops(&self) -> f64 {
        self.result.ios as f64 / self.result.elapsed.as_secs_f64()
    }
}

/// Runs every cell, calling `progress` after each one. Images are created once in `dir` for
/// the largest disk count (see [`create_images`]) and removed when this returns, also on error.
pub fn run(
    spec: &MatrixSpec,
    dir: &Path,
    progress: impl FnMut(usize, usize, &Cell),
) -> io::Result<Vec<Cell>> {
    let images = create_images(spec, dir)?;
    run_on(spec, &images, progress)
}

/// The largest disk count's images in `dir`: driven disks at `disk_size` (stamped with
/// `verify`), idle ones at 1 MiB; each removed when dropped.
pub fn create_images(spec: &MatrixSpec, dir: &Path) -> io::Result<Vec<DiskImage>> {
    // 256 disks need an image each.
    aio::process::raise_fd_limit();
    let max_disks = spec.max_disks();
    let mut images = Vec::with_capacity(max_disks);
    for i in 0..max_disks {
        let path = dir.join(format!("disk-{i:03}.img"));
        images.push(if spec.is_stamped(i) {
            DiskImage::create_stamped(path, spec.disk_size, spec.cell.bs)?
        } else if spec.is_driven(i) {
            DiskImage::create(path, spec.disk_size, i as u8)?
        } else {
            DiskImage::create(path, 1 << 20, i as u8)?
        });
    }
    Ok(images)
}

/// Runs every cell on `images` (at least [`MatrixSpec::max_disks`]: image files from
/// [`create_images`], or regions of a device), calling `progress` after each one.
pub fn run_on(
    spec: &MatrixSpec,
    images: &[DiskImage],
    mut progress: impl FnMut(usize, usize, &Cell),
) -> io::Result<Vec<Cell>> {
    // 256 disks need two notifiers and an image each.
    aio::process::raise_fd_limit();
    if images.len() < spec.max_disks() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} images for {} disks", images.len(), spec.max_disks()),
        ));
    }
    let total = spec.run_count();
    let rounds = spec.repeat.max(1);
    let mut keys = Vec::with_capacity(spec.cell_count());
    for &engine in &spec.engines {
        for &fdmon in &spec.fdmons {
            for &disks in &spec.disks {
                for &workload in &spec.workloads {
                    for &iothreads in &spec.iothreads {
                        keys.push((engine, fdmon, disks, workload, iothreads));
                    }
                }
            }
        }
    }
    // runs[i] holds every round's run of cell i; every second round runs the cells backwards.
    let mut runs: Vec<Vec<Cell>> = keys.iter().map(|_| Vec::new()).collect();
    let mut done = 0;
    for round in 0..rounds {
        for i in crate::rounds::order(round, keys.len()) {
            let (engine, fdmon, disks, workload, iothreads) = keys[i];
            let c = run_one(spec, images, (engine, fdmon), disks, workload, iothreads)?;
            done += 1;
            progress(done, total, &c);
            runs[i].push(c);
        }
    }
    Ok(runs.into_iter().map(median_run).collect())
}

/// One run of one cell: `iothreads` iothreads, each building `fdmon` and `engine` on itself.
fn run_one(
    spec: &MatrixSpec,
    images: &[DiskImage],
    (engine, fdmon): (EngineKind, MonitorKind),
    disks: usize,
    workload: Workload,
    iothreads: usize,
) -> io::Result<Cell> {
    let mut cell = spec.cell;
    cell.disks = disks;
    cell.active = if spec.active_all { disks } else { 1 };
    cell.pattern = workload.pattern();
    cell.iothreads = iothreads;
    let build = move |_| {
        let monitor = fdmon.build()?;
        let eng = engine.build(&EngineOptions::default())?;
        Ok((monitor, eng))
    };
    let result = run_cell_on_iothreads(build, &images[..disks], cell, &spec.cpus)?;
    let mb_s = result.bytes as f64 / 1e6 / result.elapsed.as_secs_f64();
    Ok(Cell {
        fdmon,
        engine,
        disks,
        workload,
        iothreads,
        queues: cell.queues,
        result,
        rounds_mb_s: vec![mb_s],
    })
}

/// The run with the median MB/s (the lower middle one for an even count), with every run's
/// errors and verify findings added to it so that none is hidden by the choice.
fn median_run(runs: Vec<Cell>) -> Cell {
    let (errors, verified, verify_errors): (u64, u64, u64) = runs.iter().fold((0, 0, 0), |a, c| {
        (
            a.0 + c.result.errors,
            a.1 + c.result.verified_reads,
            a.2 + c.result.verify_errors,
        )
    });
    let reports: Vec<String> = runs
        .iter()
        .flat_map(|c| c.result.verify_reports.iter().cloned())
        .take(10)
        .collect();
    let rounds_mb_s: Vec<f64> = runs.iter().map(Cell::mb_s).collect();
    let mut m = crate::rounds::median_round(runs, Cell::mb_s).expect("at least one round");
    m.result.errors = errors;
    m.result.verified_reads = verified;
    m.result.verify_errors = verify_errors;
    m.result.verify_reports = reports;
    m.rounds_mb_s = rounds_mb_s;
    m
}

#[cfg(test)]
mod tests;
