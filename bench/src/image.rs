//! Test images: a file written once (so reads touch real blocks), opened with O_DIRECT, and
//! removed when dropped — also when creating it fails half-way.
//!
//! This module owns image files only; the matrix's disks and `vs-fio` / `latency` use it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use aio_core::engine::IoFile;

/// An image file, removed on drop.
#[derive(Debug)]
pub struct DiskImage {
    path: PathBuf,
    file: Option<IoFile>,
    size: u64,
}

impl DiskImage {
    /// Writes `size` bytes of a pattern derived from `seed` to `path`, syncs them and opens the
    /// file with O_DIRECT. Whatever happens, no file is left behind by a failure.
    pub fn create(path: PathBuf, size: u64, seed: u8) -> io::Result<DiskImage> {
        // The guard exists before the file does: an error below removes it.
        let mut image = DiskImage {
            path,
            file: None,
            size,
        };
        let mut f = File::create(&image.path)?;
        let chunk: Vec<u8> = (0..1usize << 20)
            .map(|i| (i as u8).wrapping_mul(7) ^ seed | 1)
            .collect();
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&image.path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{}: O_DIRECT open: {e}", image.path.display()),
                )
            })?;
        image.file = Some(IoFile::from(direct));
        Ok(image)
    }

    /// Where the image is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The image, opened with O_DIRECT.
    pub fn file(&self) -> &IoFile {
        self.file.as_ref().expect("set by create")
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for DiskImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
