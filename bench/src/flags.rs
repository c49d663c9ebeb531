//! The checks of the flags every subcommand that makes images takes (`--dir`, `--bs`, a
//! size), made before anything runs, so a run is never lost to a flag found wrong later.
//!
//! This module owns those checks and their messages (exit code 2: [`BenchError::bad_input`]).

use std::path::{Path, PathBuf};

use crate::error::BenchError;

/// Checks `--dir` (default: the system temp dir), `--bs` and the image size (`size_flag`
/// names its flag); bad input names the flag.
pub fn check_target(
    dir: Option<&Path>,
    bs: u64,
    size: u64,
    size_flag: &str,
) -> Result<PathBuf, BenchError> {
    let dir = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    if !dir.is_dir() {
        return Err(BenchError::bad_input(format!(
            "--dir {}: not an existing directory",
            dir.display()
        )));
    }
    if bs == 0 || bs % 512 != 0 {
        return Err(BenchError::bad_input(format!(
            "--bs {bs}: must be a non-zero multiple of 512 (O_DIRECT)"
        )));
    }
    if size < bs {
        return Err(BenchError::bad_input(format!(
            "{size_flag} {size} is smaller than --bs {bs}"
        )));
    }
    Ok(dir)
}
