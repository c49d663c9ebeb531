//! `aio-bench run JOBFILE...`: fio job files through aio-rs engines, reported in fio's text
//! format or fio's JSON.
//!
//! This module owns the subcommand's run: every file parsed before anything starts (a syntax
//! error anywhere stops it), the options noted as accepted without effect, `--device`
//! (every job retargeted at the fast device), the jobs in file order with a progress line each,
//! and the report in the chosen format. It never parses a job file, runs a job or formats a
//! report itself ([`aio_bench::fio::jobfile`], [`aio_bench::fio::runner`]).

use std::path::PathBuf;

use aio_bench::error::BenchError;
use aio_bench::fio::jobfile::{self, JobFile};
use aio_bench::fio::output;
use aio_bench::fio::runner::{self, JobReport};
use aio_bench::progress::Progress;
use aio_bench::targets::loopdev::LoopDevice;

use crate::RunArgs;

/// Runs `run`.
pub fn run(args: RunArgs) -> Result<(), BenchError> {
    let mut files = load_all(&args.jobfiles)?;
    let device = args.device.map(LoopDevice::attach).transpose()?;
    if let Some(dev) = &device {
        files
            .iter_mut()
            .flat_map(|f| &mut f.jobs)
            .for_each(|def| dev.retarget(def));
    }
    let reports = run_all(&files)?;
    if args.output_format == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&output::to_fio_json(&reports)).expect("json")
        );
    } else {
        print!("{}", output::to_normal(&reports));
    }
    // As fio: requests that failed make the run fail (exit 1), after the report.
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| r.result.errors > 0)
        .map(|r| {
            let errno = r.result.first_errno.unwrap_or(libc::EIO);
            format!(
                "job '{}': {} requests failed, the first with errno {errno} ({})",
                r.def.name,
                r.result.errors,
                std::io::Error::from_raw_os_error(errno)
            )
        })
        .collect();
    if !failed.is_empty() {
        return Err(BenchError::failed(failed.join("; ")));
    }
    Ok(())
}

/// Every job file, parsed; the options accepted without effect noted on stderr.
fn load_all(paths: &[PathBuf]) -> Result<Vec<JobFile>, BenchError> {
    let files: Vec<JobFile> = paths
        .iter()
        .map(|p| jobfile::load(p))
        .collect::<Result<_, _>>()?;
    for note in files.iter().flat_map(|f| &f.notes) {
        eprintln!("note: {note}");
    }
    Ok(files)
}

/// Every job of every file, in order, with a progress line each; the first that fails stops
/// the run.
fn run_all(files: &[JobFile]) -> Result<Vec<JobReport>, BenchError> {
    let total: usize = files.iter().map(|f| f.jobs.len()).sum();
    let progress = Progress::new(total as u64, "jobs");
    let mut reports = Vec::new();
    for def in files.iter().flat_map(|f| &f.jobs) {
        let r = match runner::run_one(def) {
            Ok(r) => r,
            Err(e) => {
                progress.finish();
                return Err(e.into());
            }
        };
        progress.step(
            reports.len() as u64 + 1,
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
    progress.finish();
    Ok(reports)
}
