//! Test images: a file written once (so reads touch real blocks) and opened with O_DIRECT. An
//! image file never has a name: it is created with `O_TMPFILE` in its directory (or, where
//! the file system lacks it, unlinked as soon as it is open), so only its open fds keep it,
//! and nothing is left behind however the process ends (`kill -9`, the OOM killer, a crash).
//! Another process (fio) reaches it through `/proc/PID/fd/N` ([`DiskImage::shared_path`]). An
//! image may also be a region of a block device (the fast device, [`crate::targets::loopdev`]): the
//! device is opened, never created or removed.
//!
//! This module owns image files and regions only; the matrix's disks and `vs-fio` / `latency`
//! use it.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

use aio_core::engine::IoFile;

use crate::load::verify::Ledger;

/// Bytes written per `write` while an image is created.
const CHUNK: usize = 1 << 20;

/// An image file without a name (gone with its last fd); or a region of a block device, left
/// as it is on drop.
#[derive(Debug)]
pub struct DiskImage {
    /// Where the image file would be (its directory and a name for messages), or the device.
    path: PathBuf,
    /// The image file's first fd, which keeps it alive (None for a device region).
    anonymous: Option<File>,
    file: Option<IoFile>,
    /// Where the image starts in `path` (0 for an image file).
    base: u64,
    size: u64,
    /// An image file this guard created; false for a device region.
    owned: bool,
    /// An image file that keeps its name at `path` (removed on drop).
    named: bool,
    ledger: Option<Arc<Mutex<Ledger>>>,
}

impl DiskImage {
    /// Writes `size` bytes of a pattern derived from `seed` to `path`, syncs them and opens the
    /// file with O_DIRECT. Whatever happens, no file is left behind by a failure.
    pub fn create(path: PathBuf, size: u64, seed: u8) -> io::Result<DiskImage> {
        Self::create_patterned(path, size, seed, true, false)
    }

    /// As [`create`](Self::create), opened without O_DIRECT (fio's `direct=0`), so it also
    /// works where the file system refuses O_DIRECT.
    pub fn create_buffered(path: PathBuf, size: u64, seed: u8) -> io::Result<DiskImage> {
        Self::create_patterned(path, size, seed, false, false)
    }

    /// As [`create_buffered`](Self::create_buffered), but the file keeps its name at `path`
    /// (removed on drop and by the owner's signal handler), for a tool that must find it by
    /// name: the fast device's backing file, which `losetup -j` looks up.
    pub fn create_buffered_named(path: PathBuf, size: u64, seed: u8) -> io::Result<DiskImage> {
        Self::create_patterned(path, size, seed, false, true)
    }

    fn create_patterned(
        path: PathBuf,
        size: u64,
        seed: u8,
        direct: bool,
        named: bool,
    ) -> io::Result<Self> {
        let pattern: Vec<u8> = (0..CHUNK)
            .map(|i| (i as u8).wrapping_mul(7) ^ seed | 1)
            .collect();
        let mut image = DiskImage::new(path, 0, size, true);
        image.named = named;
        image.fill_and_open(CHUNK, direct, |_, chunk| {
            chunk.copy_from_slice(&pattern[..chunk.len()])
        })
    }

    /// As [`create`](Self::create), with every `bs`-byte block stamped for `--verify`
    /// (generation 0, see [`crate::load::verify`]). `size` is rounded down to whole blocks.
    pub fn create_stamped(path: PathBuf, size: u64, bs: usize) -> io::Result<DiskImage> {
        DiskImage::new(path, 0, size, true).stamp_and_open(bs)
    }

    /// `len` bytes of the existing block device (or file) `device` from byte `base`, opened
    /// with O_DIRECT as they are: nothing is written, and nothing is removed on drop. Offsets
    /// given to [`file`](Self::file) must add [`base`](Self::base).
    pub fn region(device: PathBuf, base: u64, len: u64) -> io::Result<DiskImage> {
        let mut image = DiskImage::new(device, base, len, false);
        image.file = Some(image.open(true)?);
        Ok(image)
    }

    /// As [`region`](Self::region), with every `bs`-byte block of the region stamped for
    /// `--verify`; a stamp carries the block's offset within the region, as if the region were
    /// an image file of its own. `len` is rounded down to whole blocks.
    pub fn region_stamped(device: PathBuf, base: u64, len: u64, bs: usize) -> io::Result<Self> {
        DiskImage::new(device, base, len, false).stamp_and_open(bs)
    }

    fn new(path: PathBuf, base: u64, size: u64, owned: bool) -> DiskImage {
        DiskImage {
            path,
            anonymous: None,
            file: None,
            base,
            size,
            owned,
            named: false,
            ledger: None,
        }
    }

    /// Stamps every `bs`-byte block (generation 0), opens with O_DIRECT, and sets the ledger.
    fn stamp_and_open(mut self, bs: usize) -> io::Result<DiskImage> {
        self.size = self.size / bs as u64 * bs as u64;
        let chunk_len = bs * (CHUNK / bs).max(1);
        let size = self.size;
        let mut image = self.fill_and_open(chunk_len, true, |offset, chunk| {
            for (i, block) in chunk.chunks_mut(bs).enumerate() {
                crate::load::verify::stamp(block, offset + (i * bs) as u64, 0);
            }
        })?;
        image.ledger = Some(Arc::new(Mutex::new(Ledger::new(size / bs as u64, bs))));
        Ok(image)
    }

    /// For a stamped image: what its writer knows about each block.
    pub fn ledger(&self) -> Option<&Arc<Mutex<Ledger>>> {
        self.ledger.as_ref()
    }

    /// Writes the image (creating the file if it is `owned`, else into the existing region),
    /// `fill` writing each chunk of `chunk_len` bytes (the last may be shorter) given its offset
    /// in the image, and opens it (with O_DIRECT if `direct`).
    fn fill_and_open(
        mut self,
        chunk_len: usize,
        direct: bool,
        mut fill: impl FnMut(u64, &mut [u8]),
    ) -> io::Result<DiskImage> {
        let f = if self.owned && self.named {
            File::create(&self.path)?
        } else if self.owned {
            let f = create_anonymous(&self.path)?;
            self.anonymous = Some(f.try_clone()?);
            f
        } else {
            self.check_region(OpenOptions::new().write(true).open(&self.path)?)?
        };
        let mut chunk = vec![0u8; chunk_len];
        let mut offset = 0;
        while offset < self.size {
            let n = (self.size - offset).min(chunk_len as u64) as usize;
            fill(offset, &mut chunk[..n]);
            f.write_all_at(&chunk[..n], self.base + offset)?;
            offset += n as u64;
        }
        f.sync_all()?;
        self.file = Some(self.open(direct)?);
        Ok(self)
    }

    /// Opens the image's file for reading and writing (with O_DIRECT if `direct`): an image
    /// file through its fd (`/proc/self/fd/N`), a device region by its path.
    fn open(&self, direct: bool) -> io::Result<IoFile> {
        let at = match &self.anonymous {
            Some(f) => PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
            None => self.path.clone(),
        };
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(&at)
            .map_err(|e| {
                let how = if direct { "O_DIRECT open" } else { "open" };
                io::Error::new(e.kind(), format!("{}: {how}: {e}", self.path.display()))
            })?;
        if !self.owned {
            return self.check_region(opened).map(IoFile::from);
        }
        Ok(IoFile::from(opened))
    }

    /// `f` if the region lies inside it (seeking to the end gives the size of block devices
    /// and regular files alike).
    fn check_region(&self, mut f: File) -> io::Result<File> {
        let len = f.seek(SeekFrom::End(0))?;
        if self.base.saturating_add(self.size) > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: region {}..{} passes its end ({len} bytes)",
                    self.path.display(),
                    self.base,
                    self.base.saturating_add(self.size)
                ),
            ));
        }
        Ok(f)
    }

    /// Where the image is (for a region, the device; for an image file, its directory and
    /// the name it would have, for messages: the file has none).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path another process can open the image by while this one runs: the device, or for
    /// an image file `/proc/PID/fd/N` (fio's `--filename`).
    pub fn shared_path(&self) -> PathBuf {
        match &self.anonymous {
            Some(f) => PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd())),
            None => self.path.clone(),
        }
    }

    /// Where the image starts in its file: 0 for an image file, the region's first byte on a
    /// device. Requests on [`file`](Self::file) go to `base() + offset`.
    pub fn base(&self) -> u64 {
        self.base
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
        if self.named {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A new, nameless file in `path`'s directory, open for reading and writing: `O_TMPFILE`, or
/// where the file system lacks it (`EOPNOTSUPP`, `EISDIR` on old kernels) a file at `path`
/// unlinked at once. Either way only the fd keeps it.
fn create_anonymous(path: &Path) -> io::Result<File> {
    let dir = dir_of(path);
    let tmp = OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match tmp {
        Ok(f) => Ok(f),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            std::fs::remove_file(path)?;
            Ok(f)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{}: creating an image file: {e}", dir.display()),
        )),
    }
}

/// The directory a file at `path` is made in (`.` for a bare name).
pub fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Bytes available to an unprivileged user in the file system holding `dir` (0 if unknown).
pub fn free_bytes(dir: &Path) -> u64 {
    free_bytes_of(dir).unwrap_or(0)
}

/// Bytes available to an unprivileged user in the file system holding `dir` (`statvfs`), or
/// None when it cannot be asked.
// fsblkcnt_t and c_ulong are u64 here but 32-bit on some targets.
#[allow(clippy::useless_conversion)]
pub fn free_bytes_of(dir: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(dir)
        .ok()
        .map(|st| u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size())))
}
