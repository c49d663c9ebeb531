//! Paths made absolute before `--daemonize` leaves the directory the daemon was started in.
//!
//! This module owns that one rule (an RBD image's name is not a path).

use std::path::PathBuf;

/// `path` from the current directory (left as it is if that cannot be read).
pub(crate) fn absolute(path: &std::path::Path) -> PathBuf {
    // An RBD image's name (`rbd:pool/image...`) is not a path.
    if crate::daemon::rbd::is_rbd(path) {
        return path.to_path_buf();
    }
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
