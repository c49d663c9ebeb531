//! Why an in-flight region, or one of its queues, was refused: [`InflightError`].
//!
//! This module owns the errors and their `io::Error` kinds; never the checks that find them
//! (`region`, `recovery`).

use std::io;

use aio_virtio_blk::device::MAX_QUEUE_SIZE;

use super::layout::{MAX_QUEUES, VERSION};

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
