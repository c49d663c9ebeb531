//! Test images: a file written once (so reads touch real blocks), opened with O_DIRECT, and
//! removed when dropped — also when creating it fails half-way.
//!
//! This module owns image files only; the matrix's disks and `vs-fio` / `latency` use it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

use aio_core::engine::IoFile;

use crate::verify::Ledger;

/// Bytes written per `write` while an image is created.
const CHUNK: usize = 1 << 20;

/// An image file, removed on drop.
#[derive(Debug)]
pub struct DiskImage {
    path: PathBuf,
    file: Option<IoFile>,
    size: u64,
    ledger: Option<Arc<Mutex<Ledger>>>,
}

impl DiskImage {
    /// Writes `size` bytes of a pattern derived from `seed` to `path`, syncs them and opens the
    /// file with O_DIRECT. Whatever happens, no file is left behind by a failure.
    pub fn create(path: PathBuf, size: u64, seed: u8) -> io::Result<DiskImage> {
        Self::create_patterned(path, size, seed, true)
    }

    /// As [`create`](Self::create), opened without O_DIRECT (fio's `direct=0`), so it also
    /// works where the file system refuses O_DIRECT.
    pub fn create_buffered(path: PathBuf, size: u64, seed: u8) -> io::Result<DiskImage> {
        Self::create_patterned(path, size, seed, false)
    }

    fn create_patterned(path: PathBuf, size: u64, seed: u8, direct: bool) -> io::Result<Self> {
        let pattern: Vec<u8> = (0..CHUNK)
            .map(|i| (i as u8).wrapping_mul(7) ^ seed | 1)
            .collect();
        Self::create_with(path, size, CHUNK, direct, |_, chunk| {
            chunk.copy_from_slice(&pattern[..chunk.len()])
        })
    }

    /// As [`create`](Self::create), with every `bs`-byte block stamped for `--verify`
    /// (generation 0, see [`crate::verify`]). `size` is rounded down to whole blocks.
    pub fn create_stamped(path: PathBuf, size: u64, bs: usize) -> io::Result<DiskImage> {
        let size = size / bs as u64 * bs as u64;
        let chunk_len = bs * (CHUNK / bs).max(1);
        let mut image = Self::create_with(path, size, chunk_len, true, |offset, chunk| {
            for (i, block) in chunk.chunks_mut(bs).enumerate() {
                crate::verify::stamp(block, offset + (i * bs) as u64, 0);
            }
        })?;
        image.ledger = Some(Arc::new(Mutex::new(Ledger::new(size / bs as u64, bs))));
        Ok(image)
    }

    /// For a stamped image: what its writer knows about each block.
    pub fn ledger(&self) -> Option<&Arc<Mutex<Ledger>>> {
        self.ledger.as_ref()
    }

    /// Creates the image, `fill` writing each chunk of `chunk_len` bytes (the last may be
    /// shorter) given its offset, and opens it (with O_DIRECT if `direct`).
    fn create_with(
        path: PathBuf,
        size: u64,
        chunk_len: usize,
        direct: bool,
        mut fill: impl FnMut(u64, &mut [u8]),
    ) -> io::Result<DiskImage> {
        // The guard exists before the file does: an error below removes it.
        let mut image = DiskImage {
            path,
            file: None,
            size,
            ledger: None,
        };
        let mut f = File::create(&image.path)?;
        let mut chunk = vec![0u8; chunk_len];
        let mut offset = 0;
        while offset < size {
            let n = (size - offset).min(chunk_len as u64) as usize;
            fill(offset, &mut chunk[..n]);
            f.write_all(&chunk[..n])?;
            offset += n as u64;
        }
        f.sync_all()?;
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(&image.path)
            .map_err(|e| {
                let how = if direct { "O_DIRECT open" } else { "open" };
                io::Error::new(e.kind(), format!("{}: {how}: {e}", image.path.display()))
            })?;
        image.file = Some(IoFile::from(opened));
        Ok(image)
    }

    /// Where the image is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The image, opened with O_DIRECT (except for [`create_buffered`](Self::create_buffered)).
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
