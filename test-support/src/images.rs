//! Image directories and images: where `O_DIRECT` works (`/var/tmp`, not tmpfs), in memory
//! (`/dev/shm`), raw images filled or sparse, qcow2 images made by `qemu-img`.
//!
//! This module owns where test images go and how they are made; what is served from them is
//! the test's.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::tool;

/// A new directory under `/var/tmp` (its name starting `aio-PREFIX-`), removed when dropped.
pub fn image_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("aio-{prefix}-"))
        .tempdir_in("/var/tmp")
        .expect("a directory in /var/tmp")
}

/// A new directory in memory, `/dev/shm` (tmpfs: no disk under the test, and holes kept), or
/// in `/tmp` on a machine without it (its name starting `aio-PREFIX-`), removed when dropped.
/// A test that needs `O_DIRECT` on every kernel takes [`image_dir`] instead (tmpfs has it only
/// from Linux 6.6).
pub fn memory_dir(prefix: &str) -> tempfile::TempDir {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    tempfile::Builder::new()
        .prefix(&format!("aio-{prefix}-"))
        .tempdir_in(base)
        .unwrap_or_else(|e| panic!("a directory in {base}: {e}"))
}

/// A raw image `name` of `size` bytes in `dir`, its first `filled` bytes `byte`, the rest a
/// hole.
pub fn raw_image(dir: &Path, name: &str, size: u64, byte: u8, filled: usize) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create the image");
    f.write_all(&vec![byte; filled]).expect("fill the image");
    f.set_len(size).expect("size the image");
    path
}

/// A new qcow2 image `name` of `size` (`64M`, `1G`: qemu-img's sizes) in `dir`, made by
/// `qemu-img create`.
pub fn qcow2_image(dir: &Path, name: &str, size: &str) -> PathBuf {
    tool::run_in(
        dir,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", name, size],
    );
    dir.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_images_are_filled_then_sparse() {
        let dir = image_dir("support");
        assert!(dir.path().starts_with("/var/tmp"));
        let path = raw_image(dir.path(), "r.img", 1 << 20, 0xab, 4096);
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), 1 << 20);
        assert!(data[..4096].iter().all(|&b| b == 0xab));
        assert!(data[4096..].iter().all(|&b| b == 0));
        let memory = memory_dir("support");
        assert!(memory.path().starts_with("/dev/shm") || memory.path().starts_with("/tmp"));
        assert!(memory
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("aio-support-"));
    }
}
