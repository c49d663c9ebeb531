//! What a qcow2 image is stored in, as imago's `Storage`: a file (or block device) on the
//! queue's engine, or an RBD image through librbd (feature `rbd`).
//!
//! This module owns the choice between the two and passes every call to the one chosen; what
//! each does is `file_storage.rs`'s and `rbd_storage.rs`'s. It never parses the format.
//!
//! * Only a file has a direct path ([`EngineStorage::io_file`]): an RBD image's requests all
//!   go through imago.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use aio_core::engine::IoFile;
use imago::io_buffers::{IoVector, IoVectorMut};
use imago::storage::drivers::CommonStorageHelper;
use imago::{Storage, StorageOpenOptions};

use super::file_storage::FileStorage;
#[cfg(feature = "rbd")]
use super::rbd_storage::RbdStorage;
use super::settle::WriteCounter;

/// A qcow2 image's storage (or a backing file's).
#[derive(Debug)]
pub(crate) enum EngineStorage {
    /// A file or block device, `O_DIRECT`, on the current request's engine.
    File(FileStorage),
    /// An RBD image.
    #[cfg(feature = "rbd")]
    Rbd(RbdStorage),
}

/// `$body` with `$s` bound to the storage behind `$storage`.
macro_rules! each {
    ($storage:expr, $s:ident => $body:expr) => {
        match $storage {
            EngineStorage::File($s) => $body,
            #[cfg(feature = "rbd")]
            EngineStorage::Rbd($s) => $body,
        }
    };
}

impl fmt::Display for EngineStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        each!(self, s => fmt::Display::fmt(s, f))
    }
}

impl EngineStorage {
    /// Opens the file `path` with `O_DIRECT`, for writing when `writable`.
    pub(crate) fn open_path(path: &Path, writable: bool) -> io::Result<Self> {
        FileStorage::open_path(path, writable).map(EngineStorage::File)
    }

    /// The file, for requests outside imago (the direct path); None for an RBD image.
    pub(crate) fn io_file(&self) -> Option<&IoFile> {
        match self {
            EngineStorage::File(f) => Some(f.io_file()),
            #[cfg(feature = "rbd")]
            EngineStorage::Rbd(_) => None,
        }
    }

    /// What counts the direct path's writes among the file's writes in flight (None for an
    /// RBD image, which has no direct path).
    pub(crate) fn write_counter(&self) -> Option<WriteCounter> {
        match self {
            EngineStorage::File(f) => Some(f.write_counter()),
            #[cfg(feature = "rbd")]
            EngineStorage::Rbd(_) => None,
        }
    }
}

impl Storage for EngineStorage {
    async fn open(opts: StorageOpenOptions) -> io::Result<Self> {
        FileStorage::open(opts).await.map(EngineStorage::File)
    }

    fn mem_align(&self) -> usize {
        each!(self, s => s.mem_align())
    }

    fn req_align(&self) -> usize {
        each!(self, s => s.req_align())
    }

    fn zero_align(&self) -> usize {
        each!(self, s => s.zero_align())
    }

    fn discard_align(&self) -> usize {
        each!(self, s => s.discard_align())
    }

    fn size(&self) -> io::Result<u64> {
        each!(self, s => s.size())
    }

    fn resolve_relative_path<P: AsRef<Path>>(&self, relative: P) -> io::Result<PathBuf> {
        each!(self, s => s.resolve_relative_path(relative))
    }

    fn get_filename(&self) -> Option<PathBuf> {
        each!(self, s => s.get_filename())
    }

    async unsafe fn pure_readv(&self, bufv: IoVectorMut<'_>, offset: u64) -> io::Result<()> {
        // SAFETY: the caller's promise for this call is passed on unchanged.
        each!(self, s => unsafe { s.pure_readv(bufv, offset) }.await)
    }

    async unsafe fn pure_writev(&self, bufv: IoVector<'_>, offset: u64) -> io::Result<()> {
        // SAFETY: as above.
        each!(self, s => unsafe { s.pure_writev(bufv, offset) }.await)
    }

    async unsafe fn pure_write_zeroes(&self, offset: u64, length: u64) -> io::Result<()> {
        // SAFETY: as above.
        each!(self, s => unsafe { s.pure_write_zeroes(offset, length) }.await)
    }

    async unsafe fn pure_write_allocated_zeroes(&self, offset: u64, length: u64) -> io::Result<()> {
        // SAFETY: as above.
        each!(self, s => unsafe { s.pure_write_allocated_zeroes(offset, length) }.await)
    }

    async unsafe fn pure_discard(&self, offset: u64, length: u64) -> io::Result<()> {
        // SAFETY: as above.
        each!(self, s => unsafe { s.pure_discard(offset, length) }.await)
    }

    async fn flush(&self) -> io::Result<()> {
        each!(self, s => s.flush().await)
    }

    async fn sync(&self) -> io::Result<()> {
        each!(self, s => s.sync().await)
    }

    async fn settle_writes(&self) -> io::Result<()> {
        each!(self, s => s.settle_writes().await)
    }

    async unsafe fn invalidate_cache(&self) -> io::Result<()> {
        // SAFETY: as above.
        each!(self, s => unsafe { s.invalidate_cache() }.await)
    }

    fn get_storage_helper(&self) -> &CommonStorageHelper {
        each!(self, s => s.get_storage_helper())
    }

    async fn resize(
        &self,
        new_size: u64,
        prealloc: imago::storage::PreallocateMode,
    ) -> io::Result<()> {
        each!(self, s => s.resize(new_size, prealloc).await)
    }
}
