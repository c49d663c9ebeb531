//! `aio-bench matrix`: the scsi-disk scaling matrix from the QEMU epoll discussion, 1..256 disks
//! on one IOThread, or spread over K (`--iothreads`).
//!
//! This module owns the subcommand's run: the matrix the flags ask for (the quick matrix,
//! [`MatrixSpec::quick`], or with `--full` [`MatrixSpec::full`], each flag given applied), where the
//! disks are (regions of the fast device, or images in a private directory after a free-space
//! check; removed afterwards, also on a signal or an error), the progress lines, the reports
//! (the table on stdout, `--svg`, `--csv`, `--json`) and `--verify`'s verdict. It never runs a
//! cell or formats a report itself ([`aio_bench::matrix`], [`aio_bench::scsi`]).

use std::path::Path;

use aio::EngineKind;
use aio::MonitorKind;
use aio_bench::error::BenchError;
use aio_bench::matrix::{self, Cell, MatrixSpec};
use aio_bench::progress::Progress;
use aio_bench::scsi::{CellSpec, MemoryPath};
use aio_bench::targets::image::{free_bytes, DiskImage};
use aio_bench::targets::loopdev::{LoopDevice, LoopSpec};

use super::check_target;
use crate::MatrixArgs;

/// Runs `matrix`.
pub fn run(args: MatrixArgs) -> Result<(), BenchError> {
    let dir = check_target(args.dir.as_deref(), args.bs, args.disk_size, "--disk-size")?;
    super::check_output_paths(&[
        ("--json", args.json.as_deref()),
        ("--csv", args.csv.as_deref()),
        ("--svg", args.svg.as_deref()),
    ])?;
    if let Some(cpus) = &args.cpus {
        aio_bench::cpus::pin_to(cpus.as_slice()).map_err(BenchError::BadInput)?;
    }
    let mut spec = spec(&args);
    let disks = match args.device {
        Some(loop_spec) => Disks::on_device(loop_spec, &mut spec)?,
        None => Disks::in_dir(&dir, &spec)?,
    };
    eprintln!("{}", header(&args, &spec, &disks.place));
    let cells = run_cells(&spec, &disks.images)?;
    print!("{}", matrix::table(&spec, &cells));
    print!(
        "{}",
        matrix::scaling_table(&spec, &matrix::scaling(&spec, &cells))
    );
    write_reports(&args, &spec, &cells)?;
    if args.verify {
        verdict(&cells)?;
    }
    Ok(())
}

/// The matrix the flags ask for: the quick matrix (or the full one with `--full`) with every
/// flag given applied. With no flags it is [`MatrixSpec::quick`] itself. The backends are
/// probed only when no list is given.
fn spec(args: &MatrixArgs) -> MatrixSpec {
    let fdmons = if args.fdmon.is_empty() {
        MonitorKind::available()
    } else {
        args.fdmon.clone()
    };
    let engines = if args.engine.is_empty() {
        EngineKind::available()
    } else {
        args.engine.clone()
    };
    let mut base = MatrixSpec::quick_over(fdmons, engines);
    if args.full {
        base = base.full();
    }
    MatrixSpec {
        disks: if args.disks.is_empty() {
            base.disks
        } else {
            args.disks.iter().map(|&d| d as usize).collect()
        },
        workloads: if args.workloads.is_empty() {
            base.workloads
        } else {
            args.workloads.clone()
        },
        active_all: args.active == "all",
        cell: CellSpec {
            bs: args.bs as usize,
            iodepth: args.iodepth as usize,
            runtime: args.runtime,
            ramp: args.ramp,
            poll_max_ns: args.poll_max_ns,
            poll_idle: args.poll_idle,
            verify: args.verify,
            memory: if args.bounce {
                MemoryPath::Bounce
            } else {
                MemoryPath::Guest
            },
            queues: args.queues as usize,
            guest_sched: args.guest_sched,
            ..base.cell
        },
        disk_size: args.disk_size,
        repeat: args.repeat as usize,
        iothreads: if args.iothreads.is_empty() {
            base.iothreads
        } else {
            args.iothreads.iter().map(|&k| k as usize).collect()
        },
        cpus: args
            .cpus
            .as_ref()
            .map(|c| c.as_slice().to_vec())
            .unwrap_or_default(),
        ..base
    }
}

/// The matrix's disks and what keeps them: fields drop in order, the images before their
/// directory or device.
struct Disks {
    images: Vec<DiskImage>,
    /// Where they are, for the header.
    place: String,
    _device: Option<LoopDevice>,
}

impl Disks {
    /// Regions of the fast device, one per disk (each disk's size set in `spec`). A SIZE too
    /// small for the disks is refused before the device is set up.
    fn on_device(loop_spec: LoopSpec, spec: &mut MatrixSpec) -> Result<Disks, BenchError> {
        let max_disks = spec.max_disks();
        let bs = spec.cell.bs;
        spec.disk_size = loop_spec.per_disk(max_disks as u64, bs as u64)?;
        let dev = LoopDevice::attach(loop_spec)?;
        let images = dev.disks(max_disks, spec.disk_size, bs, |i| spec.is_stamped(i))?;
        let place = format!(
            "disks on {} ({} KiB each, direct I/O over {})",
            dev.path().display(),
            spec.disk_size >> 10,
            dev.backing_file().display()
        );
        Ok(Disks {
            images,
            place,
            _device: Some(dev),
        })
    }

    /// Images in `dir`, if its file system has room for them. They have no names (see
    /// [`DiskImage`](aio_bench::targets::image::DiskImage)): nothing is left in `dir` however the run
    /// ends. Directories that runs of older versions left behind, whose process is gone, are
    /// removed first.
    fn in_dir(dir: &Path, spec: &MatrixSpec) -> Result<Disks, BenchError> {
        aio_bench::targets::cleanup::remove_dead_runs(dir);
        // Enough free space (driven disks at --disk-size, idle ones at 1 MiB)?
        let max_disks = spec.max_disks() as u64;
        let driven = if spec.active_all { max_disks } else { 1 };
        let needed = driven * spec.disk_size + (max_disks - driven) * (1 << 20);
        let free = free_bytes(dir);
        if free < needed {
            return Err(BenchError::bad_input(format!(
                "--dir {}: {} MiB free, the images need {} MiB (use --disk-size, --disks or another --dir)",
                dir.display(),
                free >> 20,
                needed >> 20
            )));
        }
        let images = matrix::create_images(spec, dir)
            .map_err(|e| BenchError::io("matrix: creating the images", e))?;
        let place = format!("images in {} (nameless)", dir.display());
        Ok(Disks {
            images,
            place,
            _device: None,
        })
    }
}

/// The line on stderr that says what the matrix runs, and where.
fn header(args: &MatrixArgs, spec: &MatrixSpec, place: &str) -> String {
    format!(
        "matrix: fdmon {:?} x engine {:?} x disks {:?} x workloads {:?} x iothreads {:?}; {} queue(s) per disk, guests scheduled {}; bs {} iodepth {} active {} runtime {:?}; {} memory{}{}; {}",
        spec.fdmons.iter().map(|k| k.name()).collect::<Vec<_>>(),
        spec.engines.iter().map(|k| k.name()).collect::<Vec<_>>(),
        spec.disks,
        spec.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        spec.iothreads,
        spec.cell.queues,
        spec.cell.guest_sched.name(),
        args.bs,
        args.iodepth,
        args.active,
        args.runtime,
        spec.cell.memory,
        if args.repeat > 1 {
            format!("; median of {} rounds", args.repeat)
        } else {
            String::new()
        },
        args.cpus
            .as_ref()
            .map(|c| format!(
                "; on CPUs {:?} (iothread t on the list's CPU t mod {}, guests on those left)",
                c.as_slice(),
                c.as_slice().len()
            ))
            .unwrap_or_default(),
        place
    )
}

/// Every cell, with a progress line after each run.
fn run_cells(spec: &MatrixSpec, images: &[DiskImage]) -> Result<Vec<Cell>, BenchError> {
    let progress = Progress::new(spec.run_count() as u64, "cell runs");
    let cells = matrix::run_on(spec, images, |i, _, c| {
        progress.step(
            i as u64,
            format!(
                "{} {} disks={} {} iothreads={}: {:.1} MB/s, {:.0} IOPS",
                c.engine,
                c.fdmon,
                c.disks,
                c.workload.name(),
                c.iothreads,
                c.mb_s(),
                c.iops()
            ),
        );
    });
    progress.finish();
    cells.map_err(|e| BenchError::io("matrix", e))
}

/// `--svg`, `--csv` and `--json`, those given.
fn write_reports(args: &MatrixArgs, spec: &MatrixSpec, cells: &[Cell]) -> Result<(), BenchError> {
    let write = |flag: &str, path: &Path, text: String| {
        std::fs::write(path, text)
            .map_err(|e| BenchError::io(format!("{flag} {}", path.display()), e))
    };
    if let Some(path) = &args.svg {
        let svg =
            matrix::to_svg(spec, cells).map_err(|e| BenchError::failed(format!("--svg: {e}")))?;
        write("--svg", path, svg)?;
    }
    if let Some(path) = &args.csv {
        write("--csv", path, matrix::to_csv(spec, cells))?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&matrix::to_json(spec, cells)).expect("json");
        write("--json", path, text)?;
    }
    Ok(())
}

/// `--verify`'s verdict: reads checked and mismatches, each mismatch with its cell; a failure
/// if there is any.
fn verdict(cells: &[Cell]) -> Result<(), BenchError> {
    let checked: u64 = cells.iter().map(|c| c.result.verified_reads).sum();
    let bad: u64 = cells.iter().map(|c| c.result.verify_errors).sum();
    println!("verify: {checked} reads checked, {bad} mismatches");
    if bad == 0 {
        return Ok(());
    }
    for c in cells.iter().filter(|c| c.result.verify_errors > 0) {
        for r in &c.result.verify_reports {
            println!(
                "  {} {} disks={} {} iothreads={}: {r}",
                c.engine,
                c.fdmon,
                c.disks,
                c.workload.name(),
                c.iothreads
            );
        }
    }
    Err(BenchError::failed(format!("verify found {bad} mismatches")))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};
    use aio_bench::scsi::GuestSched;

    fn spec_of(argv: &[&str]) -> MatrixSpec {
        let cli = Cli::try_parse_from(argv).unwrap();
        let Command::Matrix(args) = cli.command else {
            panic!("not matrix: {argv:?}");
        };
        spec(&args)
    }

    /// The flags' defaults are the quick matrix, which is defined once
    /// ([`MatrixSpec::quick`], [`CellSpec::quick`]); `--full` is [`MatrixSpec::full`].
    #[test]
    fn no_flags_is_the_quick_matrix_and_full_the_full_one() {
        let quick = MatrixSpec::quick();
        assert_eq!(spec_of(&["aio-bench", "matrix"]), quick);
        assert_eq!(
            spec_of(&["aio-bench", "matrix", "--full"]),
            quick.clone().full()
        );
        let s = spec_of(&[
            "aio-bench",
            "matrix",
            "--full",
            "--disks",
            "2,3",
            "--iodepth",
            "4",
            "--active",
            "all",
        ]);
        assert_eq!(s.disks, vec![2, 3]);
        assert_eq!(s.workloads, quick.full().workloads);
        assert_eq!((s.cell.iodepth, s.active_all), (4, true));
        assert_eq!(s.cell.bs, CellSpec::quick().bs);
        assert_eq!(s.cell.memory, MemoryPath::Guest);
        let s = spec_of(&["aio-bench", "matrix", "--bounce", "--verify"]);
        assert_eq!((s.cell.memory, s.cell.verify), (MemoryPath::Bounce, true));
        let s = spec_of(&[
            "aio-bench",
            "matrix",
            "--iothreads",
            "1,2",
            "--queues",
            "4",
            "--cpus",
            "0-1",
        ]);
        assert_eq!((s.iothreads, s.cell.queues), (vec![1, 2], 4));
        assert_eq!((s.cell.iothreads, s.cpus), (1, vec![0, 1]));
        assert_eq!(
            s.cell.guest_sched,
            GuestSched::Normal,
            "as QEMU's threads run"
        );
        let s = spec_of(&["aio-bench", "matrix", "--guest-sched", "batch"]);
        assert_eq!(s.cell.guest_sched, GuestSched::Batch);
    }
}
