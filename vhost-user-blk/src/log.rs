//! vhost-user's dirty log: the bitmap the frontend shares (`VHOST_USER_SET_LOG_BASE` with
//! `VHOST_USER_PROTOCOL_F_LOG_SHMFD`) in which a backend marks the guest pages it wrote, so
//! that a live migration copies them again.
//!
//! This module owns the log's mapping and every access to it (atomic, within the bounds
//! checked when it is mapped); never when logging is on or which writes a queue reports
//! (`VHOST_F_LOG_ALL` and the vrings' `VHOST_VRING_F_LOG` are `crate::vhost`'s, the writes
//! `aio_virtio_blk::dirty`'s).
//!
//! The log is one bit per 4 KiB page of guest-physical memory (`VHOST_LOG_PAGE`): page `p`
//! is bit `p % 8` of byte `p / 8`. A write of `len` bytes at `addr` sets the bits of every
//! page from `addr / 4096` to `(addr + len - 1) / 4096`, with an atomic OR (every iothread
//! of the device and the frontend, which reads and clears the bits, share the bytes), after
//! the write: an OR with `Release` ordering, so a frontend that sees the bit and then reads
//! the page sees the data. A page past the end of the log (the frontend sizes it to cover
//! every guest address) is not marked; [`DirtyLog::missed`] counts such writes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use aio_virtio_blk::dirty::DirtyLogger;

/// The bytes of guest memory one bit of the log stands for (`VHOST_LOG_PAGE`).
pub const LOG_PAGE: u64 = 4096;

/// Why a log could not be mapped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The log is empty, or reaches past the end of its file (or of the address space).
    #[error(
        "a dirty log of {size} bytes at offset {offset} does not fit its file of {file} bytes"
    )]
    BadSize {
        /// The log's size in bytes, as the frontend gave it.
        size: u64,
        /// Its offset in the file.
        offset: u64,
        /// The file's size.
        file: u64,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// Which.
        what: &'static str,
        /// Its error.
        #[source]
        source: io::Error,
    },
}

/// A mapped dirty log: `len` bytes of bitmap, shared with the frontend. Unmapped when the
/// last holder drops it (queues hold it in an `Arc` while they report to it).
#[derive(Debug)]
pub struct DirtyLog {
    /// The mapping's start (page-aligned, before the log when its offset is not).
    map: NonNull<u8>,
    map_len: usize,
    /// The log's first byte, inside the mapping.
    bits: NonNull<AtomicU8>,
    len: usize,
    missed: AtomicU64,
}

// SAFETY: the mapping is plain shared memory and every access to it goes through atomics
// (`AtomicU8`) within `len`, so using it from several threads is sound.
unsafe impl Send for DirtyLog {}
// SAFETY: as above.
unsafe impl Sync for DirtyLog {}

impl Drop for DirtyLog {
    fn drop(&mut self) {
        // SAFETY: `map`/`map_len` are exactly one mapping made by `mmap` in `DirtyLog::map`,
        // and nothing refers into it once its owner is dropped.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

impl DirtyLog {
    /// Maps `size` bytes of `file` from `offset`, shared and writable, once checked to lie
    /// inside the file (a page past its end would be a `SIGBUS`, not an error).
    pub fn map(file: &File, offset: u64, size: u64) -> Result<Self, LogError> {
        let file_len = file
            .metadata()
            .map_err(|source| LogError::Os {
                what: "fstat of the dirty log",
                source,
            })?
            .len();
        let bad = || LogError::BadSize {
            size,
            offset,
            file: file_len,
        };
        let end = offset.checked_add(size).ok_or_else(bad)?;
        if size == 0 || end > file_len {
            return Err(bad());
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        // mmap wants a page-aligned offset: map from the page the log starts in.
        let start = offset - offset % page;
        let map_len = usize::try_from(end - start).map_err(|_| bad())?;
        let len = usize::try_from(size).map_err(|_| bad())?;
        let off = libc::off_t::try_from(start).map_err(|_| bad())?;
        // SAFETY: a new shared mapping of `map_len` bytes of an fd we hold, at a page-aligned
        // offset, every byte of it inside the file (checked above); the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(LogError::Os {
                what: "mmap of the dirty log",
                source: io::Error::last_os_error(),
            });
        }
        let map = NonNull::new(ptr.cast::<u8>()).ok_or_else(bad)?;
        // SAFETY: `start <= offset` and `start + map_len = end = offset + len`, so the log's
        // `len` bytes from `offset - start` are inside the mapping.
        let first = unsafe { map.as_ptr().add((offset - start) as usize) };
        Ok(DirtyLog {
            map,
            map_len,
            bits: NonNull::new(first.cast::<AtomicU8>()).ok_or_else(bad)?,
            len,
            missed: AtomicU64::new(0),
        })
    }

    /// The log's size in bytes (it covers `len * 8` pages of guest memory).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the log has no byte (never: [`map`](Self::map) refuses an empty one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks the pages of a write of `len` bytes at guest-physical address `addr` (none
    /// when `len` is 0); the pages past the log's end are left out, and counted once per
    /// call in [`missed`](Self::missed).
    pub fn mark(&self, addr: u64, len: u64) {
        let Some((first, last)) = page_range(addr, len) else {
            return;
        };
        let mut page = first;
        while page <= last {
            let byte = page / 8;
            if byte >= self.len as u64 {
                self.missed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // The pages of this write in this byte: one OR for up to 8 of them.
            let in_byte = (last - page).min(7 - page % 8) + 1;
            let mask = byte_mask(page % 8, in_byte);
            self.byte(byte as usize).fetch_or(mask, Ordering::Release);
            page += in_byte;
        }
    }

    /// Writes that reached past the log's end.
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    fn byte(&self, index: usize) -> &AtomicU8 {
        debug_assert!(index < self.len);
        // SAFETY: `index < len` (checked by the caller), so the byte is inside the mapping,
        // which lives as long as `self`; the frontend shares it, and every access here is
        // atomic.
        unsafe { &*self.bits.as_ptr().add(index) }
    }
}

impl DirtyLogger for DirtyLog {
    fn mark(&self, addr: u64, len: u64) {
        DirtyLog::mark(self, addr, len);
    }
}

/// The first and last page a write of `len` bytes at `addr` touches; none for `len` 0. A
/// write reaching past the address space ends at its last page.
pub fn page_range(addr: u64, len: u64) -> Option<(u64, u64)> {
    if len == 0 {
        return None;
    }
    let last_byte = addr.saturating_add(len - 1);
    Some((addr / LOG_PAGE, last_byte / LOG_PAGE))
}

/// `count` bits (1..=8) from bit `from`, within one byte.
fn byte_mask(from: u64, count: u64) -> u8 {
    debug_assert!(from + count <= 8 && count > 0);
    ((0xffu16 >> (8 - count)) << from) as u8
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
