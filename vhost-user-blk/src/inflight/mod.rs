//! vhost-user's in-flight I/O tracking for split virtqueues
//! (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`): the shared region that lets a backend restarted
//! under a running guest know which requests its predecessor had taken and not completed.
//!
//! This module owns the region: its layout, its creation (`VHOST_USER_GET_INFLIGHT_FD`), its
//! mapping and validation (`VHOST_USER_SET_INFLIGHT_FD`), the log a queue writes into it
//! ([`RegionLog`], the device crate's [`InflightLog`]) and the recovery when a queue starts
//! (`recovery.rs`). It never touches a ring: the device's queue runs the heads it is given.
//!
//! * **The layout is libvhost-user's**, so a region left by another backend reads the same.
//!   Queue `q` starts at `q * queue_stride(queue_size)`, the stride being
//!   `16 * queue_size + 2` rounded up to 64 bytes:
//!
//!   | offset | field |
//!   | --- | --- |
//!   | 0 | `features: u64` (unused, 0) |
//!   | 8 | `version: u16` (0: never started; 1: this layout in use) |
//!   | 10 | `desc_num: u16` (entries below) |
//!   | 12 | `last_batch_head: u16` (the head whose used element is being published) |
//!   | 14 | `used_idx: u16` (the used index once that head is out of flight) |
//!   | 16 + 16 i | `desc[i]`: `inflight: u8`, 5 bytes padding, `next: u16`, `counter: u64` |
//!
//! * **The region is created once** by the first backend, zeroed and sealed against resizing
//!   (`F_SEAL_SHRINK | F_SEAL_GROW`); the frontend keeps its memfd across reconnects and hands
//!   it to every later backend, which only maps it.
//! * **The region is input.** Its geometry is checked against the message and the file's size
//!   before it is mapped, each queue's header against the ring before the queue starts, and
//!   every access goes through a view whose bounds were checked once: a region too small,
//!   out-of-range heads, duplicate counters or a torn last batch give a refused queue or an
//!   ignored entry, never a panic or an access outside the mapping. Like guest memory, the
//!   memfd is trusted not to shrink under the mapping (it is sealed when this module made it).
//! * **Every access is atomic**: the region is memory shared with other processes (QEMU maps
//!   it too), so it is only read and written through `AtomicU8/16/64`, with release stores in
//!   the order the specification gives.

mod recovery;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use aio_virtio_blk::device::MAX_QUEUE_SIZE;
use aio_virtio_blk::inflight::InflightLog;

pub use recovery::{Recovered, RingState};

/// The layout version this module writes (`version` in each queue's header).
pub const VERSION: u16 = 1;
/// The most queues a region may describe.
pub const MAX_QUEUES: u16 = 1024;
/// Bytes of a queue's header, before its descriptor entries.
const HEADER_BYTES: u64 = 16;
/// Bytes of one descriptor's entry.
const ENTRY_BYTES: u64 = 16;
/// Queue slices start at multiples of this.
const QUEUE_ALIGN: u64 = 64;

/// The bytes one queue of `queue_size` descriptors takes in the region (libvhost-user's
/// `vu_inflight_queue_size`): `16 * queue_size + 2`, rounded up to 64.
pub fn queue_stride(queue_size: u16) -> u64 {
    (ENTRY_BYTES * u64::from(queue_size) + 2).next_multiple_of(QUEUE_ALIGN)
}

/// The bytes a region for `queues` queues of `queue_size` descriptors needs.
pub fn region_size(queues: u16, queue_size: u16) -> u64 {
    u64::from(queues) * queue_stride(queue_size)
}

/// Why a region or one of its queues was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InflightError {
    /// The queue size is 0, not a power of two, or larger than the device's rings.
    #[error("in-flight region: queue size {0} is not a power of two of at most {MAX_QUEUE_SIZE}")]
    QueueSize(u16),
    /// No queues, or more than [`MAX_QUEUES`].
    #[error("in-flight region: {0} queues (1 to {MAX_QUEUES})")]
    QueueCount(u16),
    /// The region is smaller than its queues need.
    #[error("in-flight region: {size} bytes, but {queues} queues of {queue_size} need {needed}")]
    TooSmall {
        /// The size given.
        size: u64,
        /// The size its geometry needs.
        needed: u64,
        /// Queues.
        queues: u16,
        /// Descriptors per queue.
        queue_size: u16,
    },
    /// The offset into the file is not a multiple of the page size.
    #[error("in-flight region: offset {0} is not page aligned")]
    Offset(u64),
    /// The file ends before the region does.
    #[error("in-flight region: the file has {file} bytes, it needs offset {offset} + {size}")]
    FileTooShort {
        /// The file's size.
        file: u64,
        /// The region's offset in it.
        offset: u64,
        /// The region's size.
        size: u64,
    },
    /// A system call failed (creating, sizing, sealing, mapping the memfd).
    #[error("in-flight region: {what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The ring's queue has no slice in the region.
    #[error("in-flight region: queue {queue} is not in it (it has {queues})")]
    NoSuchQueue {
        /// The queue's index.
        queue: u16,
        /// The queues the region has.
        queues: u16,
    },
    /// A queue's header is at a version this module does not know.
    #[error("in-flight region: queue {queue} is at version {version}, not {VERSION}")]
    Version {
        /// The queue's index.
        queue: u16,
        /// The version found.
        version: u16,
    },
    /// A queue's header counts fewer entries than its ring has heads, or more than fit.
    #[error(
        "in-flight region: queue {queue} has {desc_num} entries, for a ring of {ring_size} \
         (room for {room})"
    )]
    DescNum {
        /// The queue's index.
        queue: u16,
        /// The header's `desc_num`.
        desc_num: u16,
        /// The ring's size.
        ring_size: u16,
        /// Entries the region's stride holds.
        room: u16,
    },
    /// The region's used index is further behind the ring's than a ring can be.
    #[error(
        "in-flight region: queue {queue}'s used index {region} does not follow the ring's {ring}"
    )]
    UsedIndex {
        /// The queue's index.
        queue: u16,
        /// The region's `used_idx`.
        region: u16,
        /// The used ring's index.
        ring: u16,
    },
    /// The ring's avail or used index could not be read from guest memory.
    #[error("in-flight region: queue {queue}'s ring indices are not readable in guest memory")]
    RingUnreadable {
        /// The queue's index.
        queue: u16,
    },
    /// More heads are marked in flight than the driver made available past the used index.
    #[error(
        "in-flight region: queue {queue} has {marked} heads in flight, but only {available} \
         were made available past the used index"
    )]
    TooManyInFlight {
        /// The queue's index.
        queue: u16,
        /// Heads marked in flight.
        marked: usize,
        /// `avail.idx - used.idx`.
        available: u16,
    },
}

impl From<InflightError> for io::Error {
    fn from(e: InflightError) -> Self {
        let kind = match &e {
            InflightError::Os { source, .. } => source.kind(),
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

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
    queue_size: u16,
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

/// One queue's header in the region.
#[repr(C)]
struct Header {
    features: AtomicU64,
    version: AtomicU16,
    desc_num: AtomicU16,
    last_batch_head: AtomicU16,
    used_idx: AtomicU16,
}

/// One descriptor's entry in the region.
#[repr(C)]
struct Entry {
    inflight: AtomicU8,
    _padding: [AtomicU8; 5],
    next: AtomicU16,
    counter: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Header>() as u64 == HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<Entry>() as u64 == ENTRY_BYTES);

/// One queue's slice of a region: its header and `queue_size` entries.
#[derive(Debug, Clone)]
pub struct QueueRegion {
    region: Arc<InflightRegion>,
    index: u16,
    offset: usize,
}

impl QueueRegion {
    /// The queue's index in the region.
    pub fn index(&self) -> u16 {
        self.index
    }

    fn header(&self) -> &Header {
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
    fn entries(&self) -> &[Entry] {
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
    queue: QueueRegion,
    /// The counter the next taken head gets (orders resubmission).
    counter: u64,
    /// Entries in use (the ring's heads are below this).
    desc_num: usize,
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

#[cfg(test)]
mod tests;
