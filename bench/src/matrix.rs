//! The scsi-disk scaling matrix: fd monitors x engines x disk counts x workloads, and its
//! terminal table and JSON.
//!
//! This module owns the axes, the order cells run in, and the report formats. Each cell is
//! [`scsi::run_cell`](crate::scsi::run_cell).

mod report;

use std::io;
use std::path::Path;

pub use self::report::{table, to_csv, to_json, to_svg};

use crate::engines::EngineKind;
use crate::image::DiskImage;
use crate::job::Pattern;
use crate::monitors::MonitorKind;
use crate::scsi::{run_cell, CellResult, CellSpec};

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
}

impl MatrixSpec {
    /// The quick matrix, `aio-bench matrix`'s default: every fd monitor and engine this build
    /// and kernel offer (see [`MatrixSpec::quick_over`]).
    pub fn quick() -> MatrixSpec {
        MatrixSpec::quick_over(MonitorKind::available(), EngineKind::available())
    }

    /// The quick matrix over `fdmons` and `engines`: 1, 16 and 256 disks, workloads rd and
    /// randrw, one active disk, the quick cell ([`CellSpec::quick`]: 4 KiB blocks at iodepth
    /// 8, 200 ms ramp and 1 s per cell, QEMU's IOThread polling), 64 MiB images, one round.
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
        self.fdmons.len() * self.engines.len() * self.disks.len() * self.workloads.len()
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
    /// What it measured.
    pub result: CellResult,
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
    aio_core::raise_fd_limit();
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
    aio_core::raise_fd_limit();
    if images.len() < spec.max_disks() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} images for {} disks", images.len(), spec.max_disks()),
        ));
    }
    let total = spec.run_count();
    let rounds = spec.repeat.max(1);
    // runs[i] holds every round's run of cell i.
    let mut runs: Vec<Vec<Cell>> = Vec::with_capacity(spec.cell_count());
    let mut done = 0;
    for round in 0..rounds {
        let mut i = 0;
        for &engine in &spec.engines {
            for &fdmon in &spec.fdmons {
                for &disks in &spec.disks {
                    for &workload in &spec.workloads {
                        let mut cell = spec.cell;
                        cell.disks = disks;
                        cell.active = if spec.active_all { disks } else { 1 };
                        cell.pattern = workload.pattern();
                        let monitor = fdmon.build().map_err(|e| {
                            io::Error::new(e.kind(), format!("fd monitor {fdmon}: {e}"))
                        })?;
                        let eng = engine.build().map_err(|e| {
                            io::Error::new(e.kind(), format!("engine {engine}: {e}"))
                        })?;
                        let result = run_cell(monitor, eng, &images[..disks], cell)?;
                        let c = Cell {
                            fdmon,
                            engine,
                            disks,
                            workload,
                            result,
                        };
                        done += 1;
                        progress(done, total, &c);
                        if round == 0 {
                            runs.push(vec![c]);
                        } else {
                            runs[i].push(c);
                        }
                        i += 1;
                    }
                }
            }
        }
    }
    Ok(runs.into_iter().map(median_run).collect())
}

/// The run with the median MB/s (the lower middle one for an even count), with every run's
/// errors and verify findings added to it so that none is hidden by the choice.
fn median_run(mut runs: Vec<Cell>) -> Cell {
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
    runs.sort_by(|a, b| a.mb_s().total_cmp(&b.mb_s()));
    let mut m = runs.swap_remove((runs.len() - 1) / 2);
    m.result.errors = errors;
    m.result.verified_reads = verified;
    m.result.verify_errors = verify_errors;
    m.result.verify_reports = reports;
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use std::time::Duration;

    #[cfg(all(feature = "pool", feature = "poll", feature = "epoll"))]
    fn spec(memory: crate::scsi::MemoryPath) -> MatrixSpec {
        let quick = MatrixSpec::quick();
        MatrixSpec {
            fdmons: vec![MonitorKind::Poll, MonitorKind::Epoll],
            engines: vec![EngineKind::Pool],
            disks: vec![1, 4],
            cell: CellSpec {
                iodepth: 4,
                runtime: Duration::from_millis(150),
                ramp: Duration::from_millis(20),
                poll_idle: Duration::from_millis(10),
                verify: true,
                memory,
                ..quick.cell
            },
            disk_size: 1 << 20,
            repeat: 2,
            ..quick
        }
    }

    #[test]
    fn workloads_parse_and_unknown_is_an_error() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>().unwrap(), w);
        }
        assert!("seq".parse::<Workload>().unwrap_err().contains("seq"));
    }

    #[test]
    #[cfg(all(feature = "pool", feature = "poll", feature = "epoll"))]
    fn a_small_matrix_runs_every_cell_and_reports_it() {
        let spec = spec(crate::scsi::MemoryPath::Guest);
        let dir = std::env::temp_dir().join(format!("aio-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut seen = 0;
        let cells = run(&spec, &dir, |_, n, _| {
            seen += 1;
            assert_eq!(n, 16, "8 cells, 2 rounds");
        })
        .unwrap();
        assert_eq!((cells.len(), seen), (8, 16));
        for c in &cells {
            assert!(
                c.result.ios > 0,
                "{:?} {:?} moved no data",
                c.fdmon,
                c.workload
            );
            assert_eq!(c.result.errors, 0);
            assert!(c.mb_s() > 0.0);
            assert_eq!(c.result.verify_errors, 0, "{:?}", c.result.verify_reports);
            if c.workload == Workload::RandRw {
                assert!(c.result.verified_reads > 0, "randrw reads are verified");
            }
        }
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "disk images are removed"
        );
        std::fs::remove_dir(&dir).unwrap();
        let table = table(&spec, &cells);
        assert!(table.contains("engine pool (MB/s), guest memory") && table.contains("randrw"));
        let svg = to_svg(&spec, &cells).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("pool / poll") && svg.contains("MB/s"));
        let csv = to_csv(&spec, &cells);
        assert_eq!(csv.lines().count(), 9, "a header and a row per cell");
        assert!(csv.starts_with("fdmon,engine,disks,active,workload,bs,iodepth,memory,mb_s,iops"));
        assert!(csv.lines().nth(1).unwrap().contains(",guest,"), "{csv}");
        let json = to_json(&spec, &cells);
        let c0 = &json["cells"][0];
        for key in [
            "fdmon",
            "engine",
            "disks",
            "active",
            "workload",
            "bs",
            "iodepth",
            "memory",
            "mb_s",
            "iops",
            "iothread_cpu_s",
            "counters",
        ] {
            assert!(!c0[key].is_null(), "field {key} missing");
        }
        for key in ["mean", "p50", "p99", "p999"] {
            assert!(c0["lat_us"][key].is_number(), "lat_us.{key} missing");
        }
    }

    /// The copy path (`--bounce`) moves the same data: verified reads and writes on both
    /// workloads, over a fd monitor each.
    #[test]
    #[cfg(all(feature = "pool", feature = "poll", feature = "epoll"))]
    fn the_bounce_path_runs_verified() {
        let spec = MatrixSpec {
            repeat: 1,
            disks: vec![2],
            active_all: true,
            ..spec(crate::scsi::MemoryPath::Bounce)
        };
        let dir = std::env::temp_dir().join(format!("aio-bench-bounce-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cells = run(&spec, &dir, |_, _, _| {}).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(cells.len(), 4);
        for c in &cells {
            assert!(c.result.ios > 0 && c.result.errors == 0, "{c:?}");
            assert_eq!(c.result.verify_errors, 0, "{:?}", c.result.verify_reports);
        }
        assert!(cells.iter().any(|c| c.result.verified_reads > 0));
        assert_eq!(to_json(&spec, &cells)["cells"][0]["memory"], "bounce");
        assert!(table(&spec, &cells).contains("engine pool (MB/s), bounce memory"));
    }
}
