//! The subcommands of `aio-bench`, one module each, and the test target two of them share.
//!
//! Each module owns one subcommand's run, from its parsed arguments to its report on stdout:
//! it checks the input before anything is set up, sets up what the run needs (removed again
//! when it returns, also on error), runs it and prints the report. None of them parses the
//! command line (`main.rs` and [`values`]), prints an error or picks an exit code (they return
//! [`BenchError`]; `main` prints it and exits with [`BenchError::exit_code`]), or measures
//! anything itself (the library does: `aio_bench::scsi`, `matrix`, `job`, `runner`, `fio`).
//!
//! * [`matrix`]: the scsi-disk scaling matrix;
//! * [`latency`]: QD1 latency per engine with polling off and on;
//! * [`vs_fio`]: one job through fio and through one of our engines, alternating;
//! * [`run`]: fio job files;
//! * [`probe`]: the backends this build and kernel offer;
//! * [`vhost`]: a vhost-user-blk socket through libblkio, and our daemon beside
//!   qemu-storage-daemon;

pub mod latency;
pub mod matrix;
pub mod probe;
pub mod run;
pub mod values;
pub mod vhost;
pub mod vs_fio;

use std::path::Path;

use aio_bench::error::BenchError;
use aio_bench::targets::image::DiskImage;
use aio_bench::targets::loopdev::LoopDevice;

impl crate::TestTarget {
    /// Checks the target for requests of `bs` bytes and sets it up: the whole fast device with
    /// `--device` (then `size` becomes the device's), else a file of `size` bytes in `--dir`
    /// (bad input if it cannot be made). The device, if any, must outlive the image.
    pub fn open(&mut self, bs: u64) -> Result<(Option<LoopDevice>, DiskImage), BenchError> {
        self.size = self.device.map_or(self.size, |d| d.size);
        let dir = check_target(self.dir.as_deref(), bs, self.size, "--size")?;
        if let Some(spec) = self.device {
            let dev = LoopDevice::attach(spec)?;
            let image = dev.whole()?;
            return Ok((Some(dev), image));
        }
        let path = dir.join(format!("aio-bench-{}.img", std::process::id()));
        let image = DiskImage::create(path, self.size, 0).map_err(|e| {
            BenchError::bad_input(format!("creating the test file in {}: {e}", dir.display()))
        })?;
        Ok((None, image))
    }
}

pub use aio_bench::flags::check_target;

/// Checks, before anything runs, that each output file given (`--json`, `--csv`, `--svg`) can
/// be written: its directory exists and is writable, and the file, if it exists, is a file.
/// A run is never lost to an output path found wrong at its end.
pub fn check_output_paths(outputs: &[(&str, Option<&Path>)]) -> Result<(), BenchError> {
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let bad = |why: &str| {
            Err(BenchError::bad_input(format!(
                "{flag} {}: {why}",
                path.display()
            )))
        };
        if !dir.is_dir() {
            return bad(&format!("{} is not an existing directory", dir.display()));
        }
        if nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_err() {
            return bad(&format!("{} is not writable", dir.display()));
        }
        if path.exists() && !path.is_file() {
            return bad("exists and is not a file");
        }
    }
    Ok(())
}
