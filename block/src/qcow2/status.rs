//! A qcow2 image's block status: its mapping, as QEMU's qcow2 driver answers
//! `bdrv_co_block_status` for `qemu-img map` and NBD's `base:allocation`.
//!
//! This module owns turning imago's mappings into extents; it reads metadata only (through
//! imago, blocking, outside any request) and never data.
//!
//! * A cluster mapped in a file (the image's or a backing file's), compressed or not, is
//!   data, even where that file has a hole beneath it (a cluster `preallocation=metadata` left
//!   unwritten): QEMU reports such a cluster as data too (which reads zeros).
//! * An unallocated cluster with nothing beneath, and a zero cluster, are holes.

use std::io;

use imago::Mapping;

use super::{current, Qcow2Image};
use crate::status::{self, Extent, ExtentKind};

impl Qcow2Image {
    /// The extents of `[offset, offset + len)`, for an image of `size` bytes. Waits for the
    /// image's lock, which a discard holds alone: call it from a thread that runs none of this
    /// image's requests (a control thread, a worker).
    pub(crate) fn extents(&self, offset: u64, len: u64, size: u64) -> io::Result<Vec<Extent>> {
        current::block_on(self.extents_async(offset, len, size))
    }

    /// [`extents`](Self::extents) as a future: run on a queue's context (inside the
    /// request context that gives it the queue's engine), it waits for the lock and reads
    /// metadata without blocking the thread.
    pub(crate) async fn extents_async(
        &self,
        offset: u64,
        len: u64,
        size: u64,
    ) -> io::Result<Vec<Extent>> {
        let access = self.access.read().await;
        let end = offset.saturating_add(len).min(size);
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let (mapping, n) = access.get_mapping(at, end - at).await?;
            let n = n.min(end - at);
            if n == 0 {
                break;
            }
            match mapping {
                Mapping::Zero { .. } => status::push(&mut out, at, n, ExtentKind::Hole),
                Mapping::Eof { .. } => break,
                _ => status::push(&mut out, at, n, ExtentKind::Data),
            }
            at += n;
        }
        let rest = offset.saturating_add(len) - at;
        status::push(&mut out, at, rest, ExtentKind::Hole);
        Ok(out)
    }
}
