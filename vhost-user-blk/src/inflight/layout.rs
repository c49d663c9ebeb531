//! The in-flight region's layout, libvhost-user's: its limits, each queue's stride, and the
//! header and descriptor entries a queue's slice holds.
//!
//! This module owns the byte layout only; never the mapping (`region`) or what the entries
//! mean when a queue starts (`recovery`).

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8};

/// The layout version this module writes (`version` in each queue's header).
pub const VERSION: u16 = 1;
/// The most queues a region may describe.
pub const MAX_QUEUES: u16 = 1024;
/// Bytes of a queue's header, before its descriptor entries.
pub(super) const HEADER_BYTES: u64 = 16;
/// Bytes of one descriptor's entry.
pub(super) const ENTRY_BYTES: u64 = 16;
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

/// One queue's header in the region.
#[repr(C)]
pub(super) struct Header {
    pub(super) features: AtomicU64,
    pub(super) version: AtomicU16,
    pub(super) desc_num: AtomicU16,
    pub(super) last_batch_head: AtomicU16,
    pub(super) used_idx: AtomicU16,
}

/// One descriptor's entry in the region.
#[repr(C)]
pub(super) struct Entry {
    pub(super) inflight: AtomicU8,
    _padding: [AtomicU8; 5],
    pub(super) next: AtomicU16,
    pub(super) counter: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Header>() as u64 == HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<Entry>() as u64 == ENTRY_BYTES);
