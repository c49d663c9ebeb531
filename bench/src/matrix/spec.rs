//! The matrix's axes: the [`Workload`]s (the columns of the QEMU epoll discussion's table) and
//! the [`MatrixSpec`] (fd monitors, engines, disk counts, workloads, iothread counts, the
//! per-cell job, rounds, CPUs).
//!
//! This module owns what a matrix is made of; never how its cells run (`matrix`) or are
//! reported (`report`, `scaling`).

use aio::{EngineKind, MonitorKind};

use crate::load::Pattern;
use crate::scsi::CellSpec;

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
