//! One measured cell of the matrix: its place on the axes and what it measured.
//!
//! This module owns the cell's record and its rates; never how it was run (`matrix`) or
//! reported (`report`).

use aio::{EngineKind, MonitorKind};

use super::spec::Workload;
use crate::scsi::CellResult;

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
