//! A qcow2 image whose backing is a block node (QEMU's `backing=NODE`): what its unallocated
//! clusters read, and what its block status says of them, come from another image open
//! in this process, never from a second opening of that image's file (which would miss what
//! the node caches: a qcow2 node's metadata not yet written back).
//!
//! This module owns reading through the node and the fleecing rule; the node's own reads
//! are its image's, the point-in-time bookkeeping a backup's ([`crate::block_copy`]).
//!
//! * **Unallocated clusters read the node.** A cluster this image maps, zeroes or compresses
//!   is its own (imago's); one it leaves unallocated reads the node's bytes there (zeros past
//!   the node's end), and is data in block status where the node has data.
//! * **The fleecing rule.** When a backup copies the node into this image before the node's
//!   writes (a pull backup's scratch image, `sync=none`), a read through to the node holds the
//!   chunks it reads ([`crate::block_copy`]): a write of the node that would copy them waits
//!   until the read is done, so the read sees the node as it was at the backup's start. A
//!   chunk the backup copied meanwhile is read from this image instead.
//! * **Blocking.** A read through to the node is the node's blocking I/O on the calling
//!   thread (`image/outside.rs`), outside the request's engine.
//! * **No writes from exports.** A write into an unallocated cluster would have imago fill
//!   the rest of the cluster from no backing (zeros): the image refuses changes from its
//!   queues while its backing is a node. A backup's copies (whole clusters) are written.

use std::io;
use std::sync::Arc;

use aio_core::engine::AlignedBuf;
use imago::io_buffers::IoVectorMut;
use imago::{Mapping, StorageExt};

use super::{current, Opened, Qcow2Image};
use crate::image::hooks::{BackingNode, ReadHold};
use crate::status::{self, Extent, ExtentKind};

impl Qcow2Image {
    /// Reads `bufv` at `offset`, unallocated clusters from `node` (see the module's
    /// contract); without a node they read zeros.
    pub(super) async fn read_over_node(
        &self,
        access: &Opened,
        node: Option<&Arc<dyn BackingNode>>,
        bufv: IoVectorMut<'_>,
        offset: u64,
    ) -> io::Result<()> {
        let (mut rest, mut at) = (bufv, offset);
        while !rest.is_empty() {
            let (mapping, n) = access.get_mapping(at, rest.len()).await?;
            let n = n.min(rest.len());
            if n == 0 {
                rest.fill(0);
                break;
            }
            let (mut piece, tail) = rest.split_at(n);
            match (mapping, node) {
                (
                    Mapping::Raw {
                        storage, offset, ..
                    },
                    _,
                ) => storage.readv(piece, offset).await?,
                (
                    Mapping::Zero {
                        explicit: false, ..
                    },
                    Some(node),
                ) => self.read_node_range(access, node, piece, at).await?,
                (Mapping::Zero { .. } | Mapping::Eof { .. }, _) => piece.fill(0),
                _ => access.readv(piece, at).await?,
            }
            (rest, at) = (tail, at + n);
        }
        Ok(())
    }

    /// Reads `[at, at + piece.len())`, which this image left unallocated, from `node`, a chunk
    /// of its backup at a time under the fleecing rule.
    async fn read_node_range(
        &self,
        access: &Opened,
        node: &Arc<dyn BackingNode>,
        piece: IoVectorMut<'_>,
        at: u64,
    ) -> io::Result<()> {
        let copy = node.copy_to(self as *const Qcow2Image as usize);
        let chunk = copy.as_ref().map_or(u64::MAX, |c| c.chunk_size());
        let (mut rest, mut at) = (piece, at);
        while !rest.is_empty() {
            let n = rest.len().min(chunk - at % chunk);
            let (mut part, tail) = rest.split_at(n);
            let hold = copy
                .as_ref()
                .map_or(ReadHold::Free, |c| c.clone().hold_for_read(at, n));
            match hold {
                // Copied since the lookup: this image holds the chunk now, as it was (zeros
                // where it left it unallocated: the node held zeros there).
                ReadHold::Copied => Box::pin(self.read_over_node(access, None, part, at)).await?,
                hold => {
                    read_node(&**node, &mut part, at)?;
                    drop(hold);
                }
            }
            (rest, at) = (tail, at + n);
        }
        Ok(())
    }

    /// The block status of `[offset, offset + len)` where this image leaves it unallocated:
    /// the node's (holes past its end).
    pub(super) fn node_extents(
        node: &dyn BackingNode,
        offset: u64,
        len: u64,
    ) -> io::Result<Vec<Extent>> {
        let size = node.node_size();
        let inside = len.min(size.saturating_sub(offset));
        let mut out = Vec::new();
        if inside > 0 {
            let extents = current::without_engine(|| node.node_status(offset, inside))?;
            for e in extents {
                status::push(&mut out, e.offset, e.len, e.kind);
            }
        }
        status::push(&mut out, offset + inside, len - inside, ExtentKind::Hole);
        Ok(out)
    }
}

/// Reads `part` at `at` from `node`, blocking, outside this request's engine; zeros past its
/// end.
fn read_node(node: &dyn BackingNode, part: &mut IoVectorMut<'_>, at: u64) -> io::Result<()> {
    let len = part.len() as usize;
    let mut buf = AlignedBuf::new(len);
    // Sizes and requests are whole sectors: so is the part inside the node.
    let inside = (len as u64).min(node.node_size().saturating_sub(at)) as usize;
    if inside > 0 {
        current::without_engine(|| node.read_node(at, &mut buf[..inside]))?;
    }
    buf[inside..].fill(0);
    part.copy_from_slice(&buf[..len]);
    Ok(())
}
