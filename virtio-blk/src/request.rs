//! A checked chain's request run on the disk's image: the op turned into a block-layer
//! request over guest memory, the block layer's result turned into a virtio-blk status.
//!
//! This module owns the op -> [`BlockRequest`] mapping (reads and writes straight into and
//! out of guest memory, given to the block layer as iovecs the memory table keeps mapped),
//! `GET_ID`, and the statistics' view of an op. It never touches the ring: the queue
//! ([`crate::queue`]) takes chains and writes used elements, and is told each request's end
//! through its [`Reply`]. What a request does on its image is `aio-block`'s
//! ([`ImageQueue`]).

use std::rc::Rc;
use std::sync::Arc;

use aio_block::request::{BlockRequest, LentMemory, MemoryHold, Reply};
use aio_block::stats::{Accounted, IoKind, Recorder};
use aio_block::ImageQueue;
use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;
use vm_memory::{Bytes, GuestMemoryBackend};

use crate::chain::{segments_len, BlkOp, BlkRequest, GuestMemory, Segment};
use crate::device::BlockDevice;
use crate::spec;

/// What the block layer gives back with a request's end: the memory table the request was
/// parsed against, and the request (the queue's [`Reply`] turns the result into its status).
pub(crate) type RingTag = (GuestMemory, BlkRequest);

/// A disk's requests served on one queue's context, on the image's [`ImageQueue`] there.
pub(crate) struct Store<L: EventLoop + 'static, E: IoEngine + 'static> {
    device: Arc<BlockDevice>,
    image: ImageQueue<L, E>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Store<L, E> {
    pub(crate) fn new(device: Arc<BlockDevice>, engine: AttachedEngine<L, E>) -> Self {
        let image = device.image().queue(engine);
        Store { device, image }
    }

    /// The disk.
    pub(crate) fn device(&self) -> &BlockDevice {
        &self.device
    }

    /// Holds the engine's submissions until [`finish_batch`](Self::finish_batch): one batch
    /// per kick.
    pub(crate) fn plug(&self) {
        self.image.plug();
    }

    /// Sends the batch held since [`plug`](Self::plug).
    pub(crate) fn finish_batch(&self, ctx: &AioContext<L>) {
        self.image.unplug(ctx);
    }

    /// Readies what the batch's requests will look up first (a qcow2 image's direct path).
    pub(crate) fn prefetch<'r>(&self, requests: impl Iterator<Item = &'r BlkRequest>) {
        self.image.prefetch(requests.filter_map(|r| match r.op {
            BlkOp::Read { offset, .. } | BlkOp::Write { offset, .. } => Some(offset),
            _ => None,
        }));
    }

    /// Runs `request` and tells `ring` its status, now (`GET_ID`, a refusal, the null
    /// device) or when its I/O completes.
    pub(crate) fn execute<R: Reply<Tag = RingTag>>(
        &self,
        ctx: &AioContext<L>,
        ring: &Rc<R>,
        mem: &GuestMemory,
        request: BlkRequest,
    ) {
        let unmapped = || std::io::Error::other("a data segment is not in guest memory");
        let block = match &request.op {
            BlkOp::GetId { buf } => {
                let written = mem.write_slice(&self.device.id_bytes(), buf.addr);
                let result = written.map_err(|_| unmapped());
                return ring.finish((mem.clone(), request), result);
            }
            BlkOp::Read { offset, segments } => match guest_buffers(mem, segments) {
                Some(buffers) => BlockRequest::Read {
                    offset: *offset,
                    buffers,
                },
                None => return ring.finish((mem.clone(), request), Err(unmapped())),
            },
            BlkOp::Write { offset, segments } => match guest_buffers(mem, segments) {
                Some(buffers) => BlockRequest::Write {
                    offset: *offset,
                    buffers,
                    fua: false,
                },
                None => return ring.finish((mem.clone(), request), Err(unmapped())),
            },
            BlkOp::Flush => BlockRequest::Flush,
            BlkOp::Discard { offset, len } => BlockRequest::Discard {
                offset: *offset,
                len: *len,
            },
            BlkOp::WriteZeroes { offset, len, unmap } => BlockRequest::WriteZeroes {
                offset: *offset,
                len: *len,
                unmap: *unmap,
            },
        };
        self.image.submit(ctx, ring, block, (mem.clone(), request));
    }
}

/// `segments` of `mem` as memory lent to the block layer (each segment may span regions),
/// held by the memory table; None if one is not mapped (the chain parser checked it; a new table
/// could not have been swapped in since, since `mem` is the table the chain was parsed
/// against).
fn guest_buffers(mem: &GuestMemory, segments: &[Segment]) -> Option<LentMemory> {
    // Each segment pushed lies in a mapping of `mem`, and the memory's hold is a clone of
    // `mem` (an `Arc` of the mappings): the block layer keeps it, or a clone of it, until the
    // engine is done with the memory, so the mappings stay while the kernel may touch them. This
    // process never makes Rust references to guest memory elsewhere (vm-memory's accesses
    // are volatile), and a chain's data descriptors are the device's alone while it runs the
    // request; the driver writing its own buffer meanwhile is a race only for the guest.
    let hold: MemoryHold = mem.clone();
    let mut buffers = LentMemory::empty(Some(hold));
    for s in segments {
        // Nearly every segment lies in one region: its slice, not vm-memory's iterator over
        // regions (which the compiler leaves out of line on this hot path).
        if let Ok(slice) = mem.get_slice(s.addr, s.len as usize) {
            // SAFETY: the slice is in `mem`, held by the lent memory (see above).
            unsafe { buffers.push(slice.ptr_guard_mut().as_ptr(), slice.len()) };
            continue;
        }
        for slice in mem.get_slices(s.addr, s.len as usize) {
            let slice = slice.ok()?;
            // SAFETY: as above.
            unsafe { buffers.push(slice.ptr_guard_mut().as_ptr(), slice.len()) };
        }
    }
    Some(buffers)
}

/// What `op` counts as in the disk's statistics (`GET_ID` is not counted).
fn accounted(op: &BlkOp) -> Option<Accounted> {
    let (kind, bytes, end) = match op {
        BlkOp::Read { segments, .. } => (IoKind::Read, segments_len(segments), None),
        BlkOp::Write { offset, segments } => {
            let len = segments_len(segments);
            (IoKind::Write, len, Some(offset + len))
        }
        BlkOp::WriteZeroes { offset, len, .. } => (IoKind::Write, *len, Some(offset + len)),
        BlkOp::Flush => (IoKind::Flush, 0, None),
        BlkOp::Discard { len, .. } => (IoKind::Unmap, *len, None),
        BlkOp::GetId { .. } => return None,
    };
    Some(Accounted { kind, bytes, end })
}

/// Counts `request`, done with `status`, in `recorder`. Kept out of line: the queue's hot
/// path (generic) carries one call of the counting and nothing else of it.
#[inline(never)]
pub(crate) fn record_done(recorder: &Recorder, request: &BlkRequest, status: u8) {
    recorder.done(request.head, accounted(&request.op), status == spec::S_OK);
}

/// A chain whose header gave `request_type` was refused before it ran: counted as an invalid
/// request of its kind, as QEMU's virtio-blk counts them (requests of no kind, and chains
/// refused before their header was read, are not counted).
#[inline(never)]
pub(crate) fn record_invalid(recorder: &Recorder, request_type: Option<u32>) {
    let kind = match request_type {
        Some(spec::T_IN) => IoKind::Read,
        Some(spec::T_OUT | spec::T_WRITE_ZEROES) => IoKind::Write,
        Some(spec::T_FLUSH) => IoKind::Flush,
        Some(spec::T_DISCARD) => IoKind::Unmap,
        _ => return,
    };
    recorder.invalid(kind);
}
