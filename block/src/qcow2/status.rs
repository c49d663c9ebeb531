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
//! * An unallocated cluster over a backing node is what the node's block status says.

use std::io;

use imago::{Mapping, ShallowMapping};

use super::{current, Qcow2Image};
use crate::status::{self, Allocation, Extent, ExtentKind};

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
        // Unallocated clusters over a backing node are the node's (`node_backing.rs`).
        let node = self.node_backing.get();
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
                Mapping::Zero {
                    explicit: false, ..
                } if node.is_some() => {
                    let node = node.as_deref().expect("checked");
                    for e in Self::node_extents(node, at, n)? {
                        status::push(&mut out, e.offset, e.len, e.kind);
                    }
                }
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

    /// The allocation depths of `[offset, offset + len)` (QEMU's `qemu:allocation-depth`):
    /// each range's layer found through the chain one layer at a time. A cluster mapped,
    /// compressed or zeroed in a layer is that layer's; one a layer leaves to its backing file
    /// is looked for there; one no layer holds is 0, as is the range past a backing file's end.
    pub(crate) async fn depths_async(
        &self,
        offset: u64,
        len: u64,
        size: u64,
    ) -> io::Result<Vec<Allocation>> {
        let access = self.access.read().await;
        let end = offset.saturating_add(len).min(size);
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let (mut layer, mut layer_at, mut depth) = (&**access, at, 1u32);
            let mut max = end - at;
            let found = loop {
                let (mapping, n) = layer.get_shallow_mapping(layer_at, max).await?;
                max = n.min(max);
                match mapping {
                    ShallowMapping::Indirect {
                        layer: below,
                        offset: below_at,
                        ..
                    } => {
                        (layer, layer_at) = (below, below_at);
                        depth += 1;
                    }
                    ShallowMapping::Zero {
                        explicit: false, ..
                    } => break 0,
                    ShallowMapping::Eof { .. } if depth > 1 => break 0,
                    ShallowMapping::Eof { .. } => {
                        max = 0;
                        break 0;
                    }
                    _ => break depth,
                }
            };
            if max == 0 {
                break;
            }
            status::push_depth(&mut out, at, max, found);
            at += max;
        }
        let rest = offset.saturating_add(len) - at;
        status::push_depth(&mut out, at, rest, 0);
        Ok(out)
    }
}
