//! A block-layer request: what an export (a virtio-blk queue, an NBD connection) asks of an
//! image, its data in memory the caller lends.
//!
//! This module owns the request type ([`BlockRequest`]) and how a request's end is told
//! ([`Reply`]); it never submits anything (that is [`ImageQueue`](crate::ImageQueue)'s) and
//! knows no export's types. The memory is aio-core's [`LentMemory`], the one type every layer
//! lends memory with, re-exported here.
//!
//! * **No copy of the data.** A read goes straight into the caller's memory and a write
//!   straight from it (guest RAM, a socket's receive buffer, an
//!   [`AlignedBuf`](aio_core::engine::AlignedBuf)). The caller promises once, in
//!   [`LentMemory::new`], that the memory stays valid and is not touched by anyone else while
//!   it is lent; the block layer keeps the memory, or a clone of its hold, until the engine
//!   (the kernel, a worker) is done with it, even if the request's task is dropped first.
//!   Memory lent without a hold is copied where a request would lend parts of it on (a qcow2
//!   image's storage I/O), since only a hold keeps it valid for them.
//! * **Each request ends once.** [`Reply::finish`] is called exactly once per request given
//!   to [`ImageQueue::submit`](crate::ImageQueue::submit), with the tag the caller gave and
//!   the result, on the thread that submitted it, after every part of its memory has come
//!   back.
//! * **Discard is advisory.** A discard the image or file system cannot do succeeds, as
//!   QEMU's `bdrv_co_pdiscard` treats `ENOTSUP`.

use std::io;

pub use aio_core::engine::{LentMemory, MemoryHold, ReturnedBuf};

/// The old name of the memory of a read or write, for one release: it is
/// [`LentMemory`] now. `Buffers::new(segments, hold)` is `LentMemory::new(segments,
/// Some(hold))`, `Buffers::empty(hold)` is `LentMemory::empty(Some(hold))`, and `len()` counts
/// in `usize`.
#[deprecated(note = "use `LentMemory` (aio_core::engine::LentMemory)")]
pub type Buffers = LentMemory;

/// What a request asks of an image. Offsets and lengths are bytes of the image's virtual
/// disk; a request past its end is refused (`EINVAL`).
#[derive(Debug)]
pub enum BlockRequest {
    /// Read `buffers.len()` bytes at `offset` into `buffers`.
    Read {
        /// Byte offset on the disk.
        offset: u64,
        /// Where the data goes.
        buffers: LentMemory,
    },
    /// Write `buffers` at `offset`.
    Write {
        /// Byte offset on the disk.
        offset: u64,
        /// The data.
        buffers: LentMemory,
        /// Force unit access: the data is on stable storage when the request ends
        /// (`RWF_DSYNC` on a raw image; a qcow2 image flushes after the write).
        fua: bool,
    },
    /// Make every write that has ended durable (`fdatasync`, a qcow2 image's metadata
    /// written and synced first).
    Flush,
    /// Let the image forget `len` bytes at `offset` (advisory: they may read as anything).
    Discard {
        /// Byte offset on the disk.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Make `len` bytes at `offset` read as zeros; `unmap` lets the image deallocate them.
    WriteZeroes {
        /// Byte offset on the disk.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Whether the range may be deallocated.
        unmap: bool,
    },
}

impl BlockRequest {
    /// The byte range it touches (None: a flush).
    pub fn range(&self) -> Option<(u64, u64)> {
        match self {
            BlockRequest::Read { offset, buffers }
            | BlockRequest::Write {
                offset, buffers, ..
            } => Some((*offset, buffers.len() as u64)),
            BlockRequest::Discard { offset, len }
            | BlockRequest::WriteZeroes { offset, len, .. } => Some((*offset, *len)),
            BlockRequest::Flush => None,
        }
    }

    /// Whether it changes the image (everything but a read and a flush).
    pub fn modifies(&self) -> bool {
        !matches!(self, BlockRequest::Read { .. } | BlockRequest::Flush)
    }
}

/// Where requests end: an export's completion path (a virtio queue's used ring, an NBD
/// connection's reply writer).
pub trait Reply: 'static {
    /// What the export identifies a request by (its ring head and memory table, its NBD
    /// cookie), given back with the result.
    type Tag: 'static;

    /// The request tagged `tag` ended with `result` (on the thread that submitted it, once).
    fn finish(&self, tag: Self::Tag, result: io::Result<()>);

    /// A read or write went through a bounce buffer (its memory was misaligned for
    /// `O_DIRECT`): for the export's counters.
    fn bounced(&self) {}
}

/// The error of a request refused before it ran.
pub(crate) fn invalid() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// The error of a write, discard or write-zeroes on a read-only image.
pub(crate) fn read_only() -> io::Error {
    io::Error::from_raw_os_error(libc::EPERM)
}
