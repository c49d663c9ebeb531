//! Turning one descriptor chain into a checked virtio-blk request.
//!
//! This module owns the rules a driver's chain must follow before anything touches guest
//! memory or the disk (a guest driver is hostile, as QEMU's `virtio_error()` assumes):
//!
//! * the chain ends (its last descriptor has no `NEXT`): a chain longer than the queue or its
//!   indirect table, or one that loops, is refused (the ring crate stops walking it after that
//!   many descriptors, so the last one seen still points on);
//! * every descriptor lies inside the memory table, with no overflow of `addr + len`;
//! * the header is one driver-readable descriptor of exactly 16 bytes, the status one
//!   device-writable descriptor of exactly 1 byte, the data in between all of one direction;
//! * `IN` / `OUT`: at most `seg_max` data descriptors, each at most `size_max` bytes, a length
//!   that is a whole number of sectors, and `sector * 512 + len` inside the capacity (checked
//!   arithmetic); writes to a read-only disk are refused;
//! * `DISCARD` / `WRITE_ZEROES`: one segment of 16 bytes, inside the capacity and the
//!   per-request limit, flags the type allows; `GET_ID`: a buffer of at least 20 bytes;
//! * an unknown type is `VIRTIO_BLK_S_UNSUPP`, every other refusal `VIRTIO_BLK_S_IOERR`.
//!
//! It reads descriptors and the header (and a range segment) only; it never writes guest
//! memory and never submits I/O.

use smallvec::SmallVec;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::spec::{self, SECTOR_SIZE};

/// What a chain may ask of the disk behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainLimits {
    /// The disk's size in 512-byte sectors.
    pub capacity_sectors: u64,
    /// Writes, discards and write-zeroes are refused.
    pub read_only: bool,
    /// The most data descriptors in one `IN` / `OUT` request (`seg_max`).
    pub seg_max: u32,
    /// The largest data descriptor in bytes (`size_max`).
    pub size_max: u32,
    /// The most sectors in one discard (`max_discard_sectors`).
    pub max_discard_sectors: u32,
    /// The most sectors in one write-zeroes (`max_write_zeroes_sectors`).
    pub max_write_zeroes_sectors: u32,
}

/// The guest's memory as one request sees it: the mappings stay while any holder lives.
pub type GuestMemory = std::sync::Arc<GuestMemoryMmap>;

/// One data descriptor: `len` bytes of guest memory at `addr`, inside the memory table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The guest-physical address.
    pub addr: GuestAddress,
    /// The length in bytes.
    pub len: u32,
}

/// The bytes of all of `segments` (a request's data length).
pub(crate) fn segments_len(segments: &[Segment]) -> u64 {
    segments.iter().map(|s| u64::from(s.len)).sum()
}

/// What a checked request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlkOp {
    /// `VIRTIO_BLK_T_IN`: read `len` bytes at byte `offset` into the segments.
    Read {
        /// Byte offset on the disk.
        offset: u64,
        /// The device-writable data descriptors, in order.
        segments: Vec<Segment>,
    },
    /// `VIRTIO_BLK_T_OUT`: write the segments at byte `offset`.
    Write {
        /// Byte offset on the disk.
        offset: u64,
        /// The driver-readable data descriptors, in order.
        segments: Vec<Segment>,
    },
    /// `VIRTIO_BLK_T_FLUSH`.
    Flush,
    /// `VIRTIO_BLK_T_GET_ID`: the serial goes into `buf` (at least 20 bytes).
    GetId {
        /// The device-writable buffer.
        buf: Segment,
    },
    /// `VIRTIO_BLK_T_DISCARD` of one byte range.
    Discard {
        /// Byte offset on the disk.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// `VIRTIO_BLK_T_WRITE_ZEROES` of one byte range.
    WriteZeroes {
        /// Byte offset on the disk.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// `VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP`: the range may be deallocated.
        unmap: bool,
    },
}

/// A chain that passed every check: what to do, and where its status byte goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkRequest {
    /// The chain's head index (for the used ring).
    pub head: u16,
    /// What to do.
    pub op: BlkOp,
    /// The status byte's guest address (inside the memory table, device-writable).
    pub status: GuestAddress,
}

impl BlkRequest {
    /// The bytes the device writes into the chain when the request succeeds (the used
    /// ring's `len`): the data read or the serial, plus the status byte.
    pub fn written_len(&self) -> u32 {
        let data = match &self.op {
            BlkOp::Read { segments, .. } => segments.iter().map(|s| s.len).sum(),
            BlkOp::GetId { .. } => spec::ID_BYTES as u32,
            _ => 0,
        };
        data + 1
    }
}

/// Why a chain was refused. Every variant but [`ChainError::UnsupportedType`] answers
/// `VIRTIO_BLK_S_IOERR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// No descriptor could be read (the head is outside the table, or an indirect table is
    /// outside guest memory, nested, or of a bad size).
    #[error("the chain has no readable descriptor")]
    Empty,
    /// The chain does not end: longer than the queue or its indirect table, or a loop.
    #[error("the chain does not end within {seen} descriptors (too long, or a loop)")]
    Unterminated {
        /// Descriptors walked.
        seen: usize,
    },
    /// A descriptor reaches outside the memory table (or `addr + len` overflows).
    #[error("descriptor {index} ({len} bytes at {addr:#x}) is outside guest memory")]
    OutsideMemory {
        /// Its position in the chain.
        index: usize,
        /// Its guest address.
        addr: u64,
        /// Its length.
        len: u32,
    },
    /// The header descriptor is not 16 driver-readable bytes.
    #[error("bad header descriptor ({len} bytes, device-writable: {writable})")]
    BadHeader {
        /// Its length.
        len: u32,
        /// Whether it was device-writable.
        writable: bool,
    },
    /// The last descriptor is not 1 device-writable byte.
    #[error("bad status descriptor ({len} bytes, device-writable: {writable})")]
    BadStatus {
        /// Its length.
        len: u32,
        /// Whether it was device-writable.
        writable: bool,
    },
    /// A data descriptor has the wrong direction for the request type.
    #[error("data descriptor {index} has the wrong direction for this request")]
    WrongDirection {
        /// Its position in the chain.
        index: usize,
    },
    /// More data descriptors than `seg_max`.
    #[error("{count} data segments, more than seg_max {max}")]
    TooManySegments {
        /// How many.
        count: usize,
        /// The limit.
        max: u32,
    },
    /// A data descriptor longer than `size_max`.
    #[error("a data segment of {len} bytes, more than size_max {max}")]
    SegmentTooLarge {
        /// Its length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The data length is not a whole number of sectors (or is zero where data is needed).
    #[error("a data length of {len} bytes is not a positive multiple of 512")]
    BadLength {
        /// The length.
        len: u64,
    },
    /// The request reaches past the capacity, or its byte offset overflows.
    #[error("sector {sector} + {len} bytes is outside the disk ({capacity} sectors)")]
    OutOfRange {
        /// The first sector.
        sector: u64,
        /// The length in bytes.
        len: u64,
        /// The capacity in sectors.
        capacity: u64,
    },
    /// A write, discard or write-zeroes to a read-only disk.
    #[error("the disk is read-only")]
    ReadOnly,
    /// A `GET_ID` buffer shorter than 20 bytes.
    #[error("a GET_ID buffer of {len} bytes (20 needed)")]
    IdBufferTooShort {
        /// Its length.
        len: u64,
    },
    /// A discard or write-zeroes that is not one 16-byte segment within the limits, or has
    /// flags the type does not allow.
    #[error("bad discard/write-zeroes segment: {0}")]
    BadRangeSegment(&'static str),
    /// A request type this device does not implement (`VIRTIO_BLK_S_UNSUPP`).
    #[error("request type {0} is not supported")]
    UnsupportedType(u32),
}

impl ChainError {
    /// The status byte the driver gets for it.
    pub fn status(&self) -> u8 {
        match self {
            ChainError::UnsupportedType(_) => spec::S_UNSUPP,
            _ => spec::S_IOERR,
        }
    }
}

/// A refused chain: why, and where its status byte can go (none when the chain is too broken
/// to have one; the device then returns the head with a used length of 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedChain {
    /// The chain's head index.
    pub head: u16,
    /// Where the status byte goes, if the chain has a valid one.
    pub status: Option<GuestAddress>,
    /// The request type its header gave, if the header could be read (what QEMU counts an
    /// invalid request of: `invalid_rd_operations`...).
    pub request_type: Option<u32>,
    /// Why.
    pub error: ChainError,
}

/// Checks `chain` against `mem` and `limits` and returns the request, or why it is refused.
/// Reads the descriptors, the header and a range segment; writes nothing.
pub fn parse_chain<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryMmap,
    limits: &ChainLimits,
) -> Result<BlkRequest, RefusedChain>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let head = chain.head_index();
    // Inline for the usual chain (header, data, status): no allocation per request.
    let descs: SmallVec<[Descriptor; 4]> = chain.collect();
    parse_descriptors(head, &descs, mem, limits)
}

/// Walks the chain that starts at descriptor `head` of the table at `desc_table` (a ring of
/// `queue_size` entries), with the ring crate's rules: at most `queue_size` descriptors (an
/// indirect table: at most its own length), one level of indirection, a table whose length
/// is a multiple of 16, at most 2^32 bytes in all. The walk stops where a rule is broken or a
/// descriptor cannot be read, so the caller sees a chain that does not end.
///
/// This is how a device reaches a chain that is not in the avail ring any more: a request
/// resubmitted from vhost-user's in-flight region after a restart.
pub fn descriptors_at(
    mem: &GuestMemoryMmap,
    desc_table: GuestAddress,
    queue_size: u16,
    head: u16,
) -> Vec<Descriptor> {
    const DESC_BYTES: u32 = std::mem::size_of::<Descriptor>() as u32;
    let (mut table, mut size, mut ttl, mut next) = (desc_table, queue_size, queue_size, head);
    let (mut indirect, mut bytes) = (false, 0u32);
    let mut descs = Vec::new();
    while ttl > 0 && next < size {
        let Some(at) = table.checked_add(u64::from(next) * u64::from(DESC_BYTES)) else {
            break;
        };
        let Ok(desc) = mem.read_obj::<Descriptor>(at) else {
            break;
        };
        if desc.refers_to_indirect_table() {
            let entries = desc.len() / DESC_BYTES;
            if indirect || desc.len() % DESC_BYTES != 0 || entries > u32::from(u16::MAX) {
                break;
            }
            (table, size, ttl, next) = (desc.addr(), entries as u16, entries as u16, 0);
            indirect = true;
            continue;
        }
        let Some(total) = bytes.checked_add(desc.len()) else {
            break;
        };
        bytes = total;
        if desc.has_next() {
            next = desc.next();
            ttl -= 1;
        } else {
            ttl = 0;
        }
        descs.push(desc);
    }
    descs
}

/// [`parse_chain`] for the chain at `head` of the descriptor table (see [`descriptors_at`]).
pub fn parse_head(
    mem: &GuestMemoryMmap,
    desc_table: GuestAddress,
    queue_size: u16,
    head: u16,
    limits: &ChainLimits,
) -> Result<BlkRequest, RefusedChain> {
    let descs = descriptors_at(mem, desc_table, queue_size, head);
    parse_descriptors(head, &descs, mem, limits)
}

/// The checks of [`parse_chain`] on the descriptors of the chain at `head`, as walked.
fn parse_descriptors(
    head: u16,
    descs: &[Descriptor],
    mem: &GuestMemoryMmap,
    limits: &ChainLimits,
) -> Result<BlkRequest, RefusedChain> {
    let refuse = |status, error| RefusedChain {
        head,
        status,
        request_type: None,
        error,
    };
    let Some(last) = descs.last() else {
        return Err(refuse(None, ChainError::Empty));
    };
    if last.has_next() {
        let seen = descs.len();
        return Err(refuse(None, ChainError::Unterminated { seen }));
    }
    for (index, d) in descs.iter().enumerate() {
        if !inside(mem, d.addr(), d.len()) {
            let (addr, len) = (d.addr().raw_value(), d.len());
            return Err(refuse(None, ChainError::OutsideMemory { index, addr, len }));
        }
    }
    if descs.len() < 2 || !last.is_write_only() || last.len() != 1 {
        let (len, writable) = (last.len(), last.is_write_only());
        return Err(refuse(None, ChainError::BadStatus { len, writable }));
    }
    let status = Some(last.addr());
    let header = descs[0];
    if header.is_write_only() || header.len() != spec::HEADER_BYTES {
        let (len, writable) = (header.len(), header.is_write_only());
        return Err(refuse(status, ChainError::BadHeader { len, writable }));
    }
    // The header lies inside guest memory (checked above); a failed read is a bad chain too.
    let read_u32 = |at: GuestAddress| mem.read_obj::<u32>(at).map(u32::from_le);
    let request_type = read_u32(header.addr());
    let sector = mem
        .read_obj::<u64>(header.addr().unchecked_add(8))
        .map(u64::from_le);
    let (Ok(request_type), Ok(sector)) = (request_type, sector) else {
        return Err(refuse(
            status,
            ChainError::BadHeader {
                len: 16,
                writable: false,
            },
        ));
    };
    let data = &descs[1..descs.len() - 1];
    let op = parse_op(request_type, sector, data, mem, limits).map_err(|error| RefusedChain {
        request_type: Some(request_type),
        ..refuse(status, error)
    })?;
    Ok(BlkRequest {
        head,
        op,
        status: last.addr(),
    })
}

/// Whether `len` bytes at `addr` lie inside the memory table, without overflow.
fn inside(mem: &GuestMemoryMmap, addr: GuestAddress, len: u32) -> bool {
    addr.checked_add(u64::from(len)).is_some() && mem.check_range(addr, len as usize)
}

/// The op of a request of `request_type` at `sector` with the data descriptors `data`.
fn parse_op(
    request_type: u32,
    sector: u64,
    data: &[Descriptor],
    mem: &GuestMemoryMmap,
    limits: &ChainLimits,
) -> Result<BlkOp, ChainError> {
    let writes_guest = match request_type {
        spec::T_IN | spec::T_GET_ID => true,
        spec::T_OUT | spec::T_FLUSH | spec::T_DISCARD | spec::T_WRITE_ZEROES => false,
        other => return Err(ChainError::UnsupportedType(other)),
    };
    if let Some(index) = data.iter().position(|d| d.is_write_only() != writes_guest) {
        return Err(ChainError::WrongDirection { index: index + 1 });
    }
    let segments: Vec<Segment> = data
        .iter()
        .map(|d| Segment {
            addr: d.addr(),
            len: d.len(),
        })
        .collect();
    let total = segments_len(&segments);
    let writes_disk = matches!(
        request_type,
        spec::T_OUT | spec::T_DISCARD | spec::T_WRITE_ZEROES
    );
    if writes_disk && limits.read_only {
        return Err(ChainError::ReadOnly);
    }
    match request_type {
        spec::T_IN | spec::T_OUT => {
            if segments.len() > limits.seg_max as usize {
                let (count, max) = (segments.len(), limits.seg_max);
                return Err(ChainError::TooManySegments { count, max });
            }
            if let Some(s) = segments.iter().find(|s| s.len > limits.size_max) {
                let (len, max) = (s.len, limits.size_max);
                return Err(ChainError::SegmentTooLarge { len, max });
            }
            if total == 0 || total % SECTOR_SIZE != 0 {
                return Err(ChainError::BadLength { len: total });
            }
            let offset = byte_range(sector, total, limits.capacity_sectors)?;
            Ok(if request_type == spec::T_IN {
                BlkOp::Read { offset, segments }
            } else {
                BlkOp::Write { offset, segments }
            })
        }
        spec::T_FLUSH => Ok(BlkOp::Flush),
        spec::T_GET_ID => match segments.as_slice() {
            [buf] if buf.len as usize >= spec::ID_BYTES => Ok(BlkOp::GetId { buf: *buf }),
            _ => Err(ChainError::IdBufferTooShort { len: total }),
        },
        _ => parse_range(request_type, &segments, mem, limits),
    }
}

/// A discard or write-zeroes: exactly one 16-byte segment descriptor.
fn parse_range(
    request_type: u32,
    segments: &[Segment],
    mem: &GuestMemoryMmap,
    limits: &ChainLimits,
) -> Result<BlkOp, ChainError> {
    let [seg] = segments else {
        return Err(ChainError::BadRangeSegment(
            "not exactly one segment descriptor",
        ));
    };
    if seg.len != spec::RANGE_SEGMENT_BYTES {
        return Err(ChainError::BadRangeSegment("a segment is 16 bytes"));
    }
    let mut raw = [0u8; 16];
    mem.read_slice(&mut raw, seg.addr)
        .map_err(|_| ChainError::BadRangeSegment("unreadable segment"))?;
    let sector = u64::from_le_bytes(raw[0..8].try_into().expect("8 bytes"));
    let sectors = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
    let flags = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes"));
    let (max, allowed_flags) = if request_type == spec::T_DISCARD {
        (limits.max_discard_sectors, 0)
    } else {
        (
            limits.max_write_zeroes_sectors,
            spec::WRITE_ZEROES_FLAG_UNMAP,
        )
    };
    if flags & !allowed_flags != 0 {
        return Err(ChainError::BadRangeSegment(
            "flags this type does not allow",
        ));
    }
    if sectors == 0 || sectors > max {
        return Err(ChainError::BadRangeSegment(
            "sector count is 0 or above the limit",
        ));
    }
    let len = u64::from(sectors) * SECTOR_SIZE;
    let offset = byte_range(sector, len, limits.capacity_sectors)?;
    Ok(if request_type == spec::T_DISCARD {
        BlkOp::Discard { offset, len }
    } else {
        BlkOp::WriteZeroes {
            offset,
            len,
            unmap: flags & spec::WRITE_ZEROES_FLAG_UNMAP != 0,
        }
    })
}

/// The byte offset of `sector`, if `len` bytes from there fit in `capacity` sectors.
fn byte_range(sector: u64, len: u64, capacity: u64) -> Result<u64, ChainError> {
    let out = || ChainError::OutOfRange {
        sector,
        len,
        capacity,
    };
    let offset = sector.checked_mul(SECTOR_SIZE).ok_or_else(out)?;
    let end = offset.checked_add(len).ok_or_else(out)?;
    let cap_bytes = capacity.checked_mul(SECTOR_SIZE).ok_or_else(out)?;
    if end > cap_bytes {
        return Err(out());
    }
    Ok(offset)
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
