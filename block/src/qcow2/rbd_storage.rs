//! imago's `Storage` over an RBD image: a qcow2 image kept in a Ceph cluster, read and
//! written through librbd.
//!
//! This module owns [`RbdStorage`]: its requests as librbd futures (woken from librbd's
//! thread, so they run inside whatever task polls them), the copy that keeps imago's buffers
//! out of librbd's hands, and growing the image as a file grows. It never parses the format.
//!
//! * **A copy, always.** librbd reads into and writes from memory of its own for each
//!   request, copied from or into imago's buffers while the future is polled: a future
//!   dropped early (a cancelled request) never leaves librbd writing into memory imago freed.
//! * **It grows as a file does.** qcow2 allocates clusters past the end of its file; an RBD
//!   image has a fixed size, so a write past the end resizes it first (in steps of 64 MiB),
//!   as QEMU's rbd driver does. Past the end reads as zeros.
//! * **No backing file**: an image in RBD names none (refused when opened).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aio_core::engine::LentMemory;
use aio_rbd::{RbdImage, RbdOp};
use imago::io_buffers::{IoVector, IoVectorMut};
use imago::storage::drivers::CommonStorageHelper;
use imago::Storage;

/// How much an image grows at least when a write passes its end.
const GROWTH: u64 = 64 << 20;

/// An RBD image as a qcow2 image's storage.
pub(crate) struct RbdStorage {
    image: Arc<RbdImage>,
    /// `rbd:pool/image`, for messages.
    name: PathBuf,
    /// The image's size: grown by writes past it.
    size: AtomicU64,
    helper: CommonStorageHelper,
}

impl fmt::Debug for RbdStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdStorage")
            .field("name", &self.name)
            .field("size", &self.size.load(Ordering::Relaxed))
            .finish()
    }
}

impl fmt::Display for RbdStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name.display())
    }
}

impl RbdStorage {
    /// The storage of `image`, named `name`.
    pub(crate) fn new(image: Arc<RbdImage>, name: &Path) -> io::Result<Self> {
        let size = image.size()?;
        Ok(RbdStorage {
            image,
            name: name.to_path_buf(),
            size: AtomicU64::new(size),
            helper: CommonStorageHelper::default(),
        })
    }

    /// Runs `op` with `memory`; its result and the memory back.
    async fn run(
        &self,
        op: RbdOp,
        memory: Option<LentMemory>,
    ) -> io::Result<(u64, Option<LentMemory>)> {
        let (result, memory) = self.image.submit(op, memory).await;
        Ok((result?, memory))
    }

    /// Makes the image at least `end` bytes long (blocking: a round trip to the cluster, once
    /// per growth step).
    fn grow_to(&self, end: u64) -> io::Result<()> {
        if end <= self.size.load(Ordering::Acquire) {
            return Ok(());
        }
        let new = end.next_multiple_of(GROWTH);
        self.image.resize(new)?;
        self.size.fetch_max(new, Ordering::AcqRel);
        Ok(())
    }

    /// Zeroes `[offset, offset + length)`, allocated (`THICK_PROVISION`) unless `unmap`.
    async fn zero(&self, offset: u64, length: u64, unmap: bool) -> io::Result<()> {
        self.grow_to(offset + length)?;
        let op = RbdOp::WriteZeroes {
            offset,
            len: length,
            unmap,
        };
        self.run(op, None).await.map(drop)
    }
}

impl Storage for RbdStorage {
    fn mem_align(&self) -> usize {
        1
    }

    fn req_align(&self) -> usize {
        1
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.size.load(Ordering::Acquire))
    }

    fn resolve_relative_path<P: AsRef<Path>>(&self, _relative: P) -> io::Result<PathBuf> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a qcow2 image in RBD has no backing file",
        ))
    }

    fn get_filename(&self) -> Option<PathBuf> {
        Some(self.name.clone())
    }

    async unsafe fn pure_readv(&self, bufv: IoVectorMut<'_>, offset: u64) -> io::Result<()> {
        let len = bufv.len();
        let inside = self
            .size
            .load(Ordering::Acquire)
            .saturating_sub(offset)
            .min(len);
        let (mut head, mut tail) = bufv.split_at(inside);
        if inside > 0 {
            let memory = LentMemory::from_vec(vec![0; inside as usize]);
            let (_, memory) = self.run(RbdOp::Read(offset), Some(memory)).await?;
            let data = memory.and_then(|m| m.into_vec().ok()).unwrap_or_default();
            head.copy_from_slice(&data);
        }
        // Past the end reads as zeros, as past a file's.
        tail.fill(0);
        Ok(())
    }

    async unsafe fn pure_writev(&self, bufv: IoVector<'_>, offset: u64) -> io::Result<()> {
        self.grow_to(offset + bufv.len())?;
        let mut data = vec![0; bufv.len() as usize];
        bufv.copy_into_slice(&mut data);
        self.run(RbdOp::Write(offset), Some(LentMemory::from_vec(data)))
            .await
            .map(drop)
    }

    async unsafe fn pure_write_zeroes(&self, offset: u64, length: u64) -> io::Result<()> {
        // Past the end reads as zeros already, and grows as zeros.
        if offset >= self.size.load(Ordering::Acquire) {
            return Ok(());
        }
        self.zero(offset, length, true).await
    }

    async unsafe fn pure_write_allocated_zeroes(&self, offset: u64, length: u64) -> io::Result<()> {
        self.zero(offset, length, false).await
    }

    async unsafe fn pure_discard(&self, offset: u64, length: u64) -> io::Result<()> {
        match self.run(RbdOp::Discard(offset, length), None).await {
            // Discard is advisory.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            other => other.map(drop),
        }
    }

    async fn flush(&self) -> io::Result<()> {
        // No buffers of its own (librbd's cache is written back by `sync`).
        Ok(())
    }

    async fn sync(&self) -> io::Result<()> {
        self.run(RbdOp::Flush, None).await.map(drop)
    }

    async unsafe fn invalidate_cache(&self) -> io::Result<()> {
        Ok(())
    }

    fn get_storage_helper(&self) -> &CommonStorageHelper {
        &self.helper
    }

    async fn resize(
        &self,
        new_size: u64,
        prealloc: imago::storage::PreallocateMode,
    ) -> io::Result<()> {
        if !matches!(prealloc, imago::storage::PreallocateMode::None) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        self.image.resize(new_size)?;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }
}
