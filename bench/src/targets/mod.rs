//! What a run reads and writes: disk images, the fast device (a loop device), the cleanup
//! that removes what a killed run left, and the checks that refuse a mounted file system.
//!
//! This module owns the targets' life (create, attach, detach, remove), never the load on
//! them (`load`, `fio::job`, `matrix`, `vhost`).

pub mod cleanup;
pub mod image;
pub mod loopdev;
pub mod mounted;

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
