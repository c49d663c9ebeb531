//! The in-flight region mapped: its creation (`VHOST_USER_GET_INFLIGHT_FD`), its mapping once
//! checked (`VHOST_USER_SET_INFLIGHT_FD`), each queue's slice of it ([`QueueRegion`]) and the
//! log a running queue writes there ([`RegionLog`]).
//!
//! This module owns the mapping and every access to it (through atomics, within bounds
//! checked once); never the layout's numbers (`layout`) or a queue's recovery (`recovery`).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use aio_virtio_blk::device::MAX_QUEUE_SIZE;
use aio_virtio_blk::inflight::InflightLog;

use super::error::InflightError;
use super::layout::{queue_stride, region_size, Entry, Header, HEADER_BYTES, MAX_QUEUES};

fn os_error(what: &'static str) -> InflightError {
    InflightError::Os {
        what,
        source: io::Error::last_os_error(),
    }
}

/// Checks a region's queue count and queue size.
fn check_geometry(queues: u16, queue_size: u16) -> Result<(), InflightError> {
    if queues == 0 || queues > MAX_QUEUES {
        return Err(InflightError::QueueCount(queues));
    }
    if !queue_size.is_power_of_two() || queue_size > MAX_QUEUE_SIZE {
        return Err(InflightError::QueueSize(queue_size));
    }
    Ok(())
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics
// (`QueueRegion`), so sharing and sending its address between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly one mapping made by `mmap` in `InflightRegion::map`,
        // and no reference into it outlives `self` (views hold an `Arc` of the region).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A mapped in-flight region: `queues` queues of `queue_size` descriptors each.
#[derive(Debug)]
pub struct InflightRegion {
    map: Mapping,
    queues: u16,
    pub(super) queue_size: u16,
}

impl InflightRegion {
    /// `VHOST_USER_GET_INFLIGHT_FD`: a new zeroed memfd for `queues` queues of `queue_size`
    /// descriptors, sealed against resizing, each queue's `desc_num` set. Returns its size
    /// and the file the frontend keeps.
    pub fn create(queues: u16, queue_size: u16) -> Result<(u64, File), InflightError> {
        check_geometry(queues, queue_size)?;
        let size = region_size(queues, queue_size);
        // SAFETY: a NUL-terminated name and flags; the returned fd is checked before use.
        let fd = unsafe {
            libc::memfd_create(
                c"aio-vhost-user-blk-inflight".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).map_err(|source| InflightError::Os {
            what: "sizing the memfd",
            source,
        })?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS on an fd we own; no pointers.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(os_error("sealing the memfd"));
        }
        let region = Arc::new(Self::map(&file, 0, size, queues, queue_size)?);
        for q in 0..queues {
            region
                .queue(q)?
                .header()
                .desc_num
                .store(queue_size, Ordering::Release);
        }
        Ok((size, file))
    }

    /// `VHOST_USER_SET_INFLIGHT_FD`: maps `size` bytes of `file` from `offset` as a region of
    /// `queues` queues of `queue_size`, once the geometry, the offset and the file's size are
    /// checked.
    pub fn map(
        file: &File,
        offset: u64,
        size: u64,
        queues: u16,
        queue_size: u16,
    ) -> Result<Self, InflightError> {
        check_geometry(queues, queue_size)?;
        let needed = region_size(queues, queue_size);
        if size < needed {
            return Err(InflightError::TooSmall {
                size,
                needed,
                queues,
                queue_size,
            });
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        if offset % page != 0 {
            return Err(InflightError::Offset(offset));
        }
        let file_len = file
            .metadata()
            .map_err(|source| InflightError::Os {
                what: "fstat",
                source,
            })?
            .len();
        if offset.checked_add(needed).is_none_or(|end| end > file_len) {
            return Err(InflightError::FileTooShort {
                file: file_len,
                offset,
                size,
            });
        }
        // Only what the queues use is mapped: every byte of it lies inside the file.
        let len = usize::try_from(needed).map_err(|_| InflightError::TooSmall {
            size,
            needed,
            queues,
            queue_size,
        })?;
        let off = libc::off_t::try_from(offset).map_err(|_| InflightError::Offset(offset))?;
        // SAFETY: a new shared mapping of `len` bytes of an fd we hold, at a page-aligned
        // offset whose end lies inside the file (checked above); the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap"));
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| os_error("mmap"))?;
        Ok(InflightRegion {
            map: Mapping { ptr, len },
            queues,
            queue_size,
        })
    }

    /// The queues the region has.
    pub fn queues(&self) -> u16 {
        self.queues
    }

    /// The descriptors each queue has room for.
    pub fn queue_size(&self) -> u16 {
        self.queue_size
    }

    /// Queue `index`'s slice of the region.
    pub fn queue(self: &Arc<Self>, index: u16) -> Result<QueueRegion, InflightError> {
        if index >= self.queues {
            return Err(InflightError::NoSuchQueue {
                queue: index,
                queues: self.queues,
            });
        }
        let offset = u64::from(index) * queue_stride(self.queue_size);
        Ok(QueueRegion {
            region: self.clone(),
            index,
            offset: offset as usize,
        })
    }
}

/// One queue's slice of a region: its header and `queue_size` entries.
#[derive(Debug, Clone)]
pub struct QueueRegion {
    pub(super) region: Arc<InflightRegion>,
    pub(super) index: u16,
    pub(super) offset: usize,
}

impl QueueRegion {
    /// The queue's index in the region.
    pub fn index(&self) -> u16 {
        self.index
    }

    pub(super) fn header(&self) -> &Header {
        // SAFETY: `offset` is `index * stride` with `index < queues`, so the header's 16
        // bytes lie inside the mapping (`queues * stride` bytes); the mapping is page aligned
        // and the stride a multiple of 64, so the header is aligned for `AtomicU64`. The
        // memory is only ever accessed through atomics, and lives as long as `self.region`.
        unsafe {
            &*self
                .region
                .map
                .ptr
                .as_ptr()
                .add(self.offset)
                .cast::<Header>()
        }
    }

    /// Every entry the slice has room for (`queue_size`), whatever the header says.
    pub(super) fn entries(&self) -> &[Entry] {
        let count = usize::from(self.region.queue_size);
        // SAFETY: the entries start 16 bytes after the header and `16 + 16 * queue_size`
        // bytes fit in one stride (`16 * queue_size + 2` rounded up to 64 is at least that),
        // so they lie inside the mapping; 16-byte entries from a 64-aligned start are aligned
        // for `AtomicU64`. Accessed through atomics only, alive as long as `self.region`.
        unsafe {
            let first = self
                .region
                .map
                .ptr
                .as_ptr()
                .add(self.offset + HEADER_BYTES as usize);
            std::slice::from_raw_parts(first.cast::<Entry>(), count)
        }
    }
}

/// The in-flight log of one running queue, written into its slice of the region in the order
/// the vhost-user specification gives for split rings.
#[derive(Debug)]
pub struct RegionLog {
    pub(super) queue: QueueRegion,
    /// The counter the next taken head gets (orders resubmission).
    pub(super) counter: u64,
    /// Entries in use (the ring's heads are below this).
    pub(super) desc_num: usize,
}

impl InflightLog for RegionLog {
    fn taken(&mut self, head: u16) {
        let Some(entry) = self.queue.entries()[..self.desc_num].get(usize::from(head)) else {
            return;
        };
        entry.counter.store(self.counter, Ordering::Relaxed);
        entry.next.store(0, Ordering::Relaxed);
        self.counter = self.counter.wrapping_add(1);
        entry.inflight.store(1, Ordering::Release);
    }

    fn completing(&mut self, head: u16) {
        self.queue
            .header()
            .last_batch_head
            .store(head, Ordering::Release);
    }

    fn completed(&mut self, head: u16, used_idx: u16) {
        if let Some(entry) = self.queue.entries()[..self.desc_num].get(usize::from(head)) {
            entry.inflight.store(0, Ordering::Release);
        }
        self.queue
            .header()
            .used_idx
            .store(used_idx, Ordering::Release);
    }
}
