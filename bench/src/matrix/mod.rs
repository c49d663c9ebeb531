//! The scsi-disk scaling matrix: fd monitors x engines x disk counts x workloads x iothread
//! counts, and its terminal table, CSV, SVG and JSON.
//!
//! This module owns the order cells run in and the median of their rounds; the axes are
//! `spec`'s, a measured cell `cell`'s, the report formats `report`'s and `scaling`'s. Each cell
//! is [`scsi::run_cell_on_iothreads`](crate::scsi::run_cell_on_iothreads): K iothreads, each
//! building its own fd monitor and engine on itself, the disks' queues spread over them.

mod cell;
mod report;
mod scaling;
mod spec;

use std::io;
use std::path::Path;

pub use self::cell::Cell;
pub use self::report::{table, to_csv, to_json, to_svg};
pub use self::scaling::{ceiling, scaling, scaling_table, Scaling};
pub use self::spec::{MatrixSpec, Workload};

use crate::scsi::run_cell_on_iothreads;
use crate::targets::image::DiskImage;
use aio::MonitorKind;
use aio::{EngineKind, EngineOptions};

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
