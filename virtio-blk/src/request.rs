//! A request's execution on its backing store: a checked chain's op turned into engine
//! requests on the disk's image, and the engine's completion turned into a virtio-blk status.
//!
//! This module owns the op -> aio request mapping (reads and writes straight into and out of
//! guest memory, a bounce buffer when the driver's buffers are misaligned for `O_DIRECT`),
//! the status rules (a discard the image cannot do is not an error), and `GET_ID`. It never
//! touches the ring: the queue ([`crate::queue`]) takes chains and writes used elements, and is
//! told each status through [`Completer`]. This is the seam where a request meets its backing
//! store: today a raw file or block device through an engine.

use std::rc::Rc;
use std::sync::Arc;

use aio_core::engine::{AlignedBuf, AttachedEngine, Completion, GuestIovecs, IoBuffers, IoEngine};
use aio_core::engine::{Request, RequestError};
use aio_core::EventLoop;
use vm_memory::{Bytes, GuestMemoryBackend};

use crate::chain::{BlkOp, BlkRequest, Segment};
use crate::device::BlockDevice;
use crate::queue::GuestMemory;
use crate::spec;

/// The ring side of a request: told once, with the request's status, when it is done.
pub(crate) trait Completer: 'static {
    /// `request` is done with `status`; `mem` is the memory table it was parsed against.
    fn finish(&self, mem: &GuestMemory, request: &BlkRequest, status: u8);
    /// `request` went through a bounce buffer (for the queue's counters).
    fn bounced(&self);
}

/// A raw image (a file or a block device, opened by [`BlockDevice`]) served through one
/// engine attached to the queue's context.
pub(crate) struct RawImage<L: EventLoop + 'static, E: IoEngine + 'static> {
    device: Arc<BlockDevice>,
    engine: AttachedEngine<L, E>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> RawImage<L, E> {
    pub(crate) fn new(device: Arc<BlockDevice>, engine: AttachedEngine<L, E>) -> Self {
        RawImage { device, engine }
    }

    /// The disk.
    pub(crate) fn device(&self) -> &BlockDevice {
        &self.device
    }

    /// Where the disk's byte `offset` is in the file: the chain's offsets are the disk's, and a
    /// window starts past the file's start.
    fn file_offset(&self, offset: u64) -> u64 {
        offset + self.device.offset()
    }

    /// Holds the engine's submissions until [`unplug`](Self::unplug): one batch per kick.
    pub(crate) fn plug(&self) {
        self.engine.plug();
    }

    /// Sends the batch held since [`plug`](Self::plug).
    pub(crate) fn unplug(&self) {
        self.engine.unplug();
    }

    /// Runs `request` and tells `ring` its status, now (`GET_ID`, a refusal) or from the
    /// engine's completion.
    pub(crate) fn execute<C: Completer>(
        &self,
        ring: &Rc<C>,
        mem: &GuestMemory,
        request: BlkRequest,
    ) {
        let file = self.device.file();
        let token = u64::from(request.head);
        let at = |offset: &u64| self.file_offset(*offset);
        let io = match &request.op {
            BlkOp::Read { offset, segments } => match guest_iovecs(mem, segments) {
                Some(iov) => Request::read_guest(file, at(offset), iov, token),
                None => return ring.finish(mem, &request, spec::S_IOERR),
            },
            BlkOp::Write { offset, segments } => match guest_iovecs(mem, segments) {
                Some(iov) => Request::write_guest(file, at(offset), iov, token),
                None => return ring.finish(mem, &request, spec::S_IOERR),
            },
            BlkOp::Flush => Request::fdatasync(file, token),
            BlkOp::Discard { offset, len } => Request::discard(file, at(offset), *len, token),
            BlkOp::WriteZeroes { offset, len, unmap } => {
                Request::write_zeroes(file, at(offset), *len, *unmap, token)
            }
            BlkOp::GetId { buf } => {
                let ok = mem.write_slice(&self.device.id_bytes(), buf.addr).is_ok();
                let status = if ok { spec::S_OK } else { spec::S_IOERR };
                return ring.finish(mem, &request, status);
            }
        };
        self.submit(ring, mem, request, io);
    }

    /// Submits `io` for `request`; a refusal for alignment goes through a bounce buffer.
    fn submit<C: Completer>(
        &self,
        ring: &Rc<C>,
        mem: &GuestMemory,
        request: BlkRequest,
        io: Request,
    ) {
        let q = ring.clone();
        let held = mem.clone();
        let is_discard = matches!(request.op, BlkOp::Discard { .. });
        let meta = request.clone();
        let refused = self
            .engine
            .submit_with(io, move |_ctx, _engine, done: Completion| {
                let status = match &done.result {
                    Ok(_) => spec::S_OK,
                    // Discard is advisory: a file system or device without it is not an error.
                    Err(e) if is_discard && e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                        spec::S_OK
                    }
                    Err(_) => spec::S_IOERR,
                };
                // The request's memory table, held until here (the kernel is done with it).
                q.finish(&held, &meta, status);
            });
        if let Err(refused) = refused {
            if matches!(refused.error, RequestError::Misaligned { .. }) {
                return self.bounce(ring, mem, request);
            }
            ring.finish(mem, &request, spec::S_IOERR);
        }
    }

    /// A read or write through an aligned buffer (the driver's buffers are not aligned for
    /// `O_DIRECT`): copied from guest memory before a write, into it after a read.
    fn bounce<C: Completer>(&self, ring: &Rc<C>, mem: &GuestMemory, request: BlkRequest) {
        ring.bounced();
        let file = self.device.file();
        let token = u64::from(request.head);
        let io = match &request.op {
            BlkOp::Read { offset, segments } => {
                let len = segments.iter().map(|s| s.len as usize).sum();
                Request::read(file, self.file_offset(*offset), AlignedBuf::new(len), token)
            }
            BlkOp::Write { offset, segments } => {
                let mut data = vec![0u8; segments.iter().map(|s| s.len as usize).sum()];
                let mut at = 0;
                for s in segments {
                    let end = at + s.len as usize;
                    if mem.read_slice(&mut data[at..end], s.addr).is_err() {
                        return ring.finish(mem, &request, spec::S_IOERR);
                    }
                    at = end;
                }
                Request::write(
                    file,
                    self.file_offset(*offset),
                    AlignedBuf::from_slice(&data),
                    token,
                )
            }
            _ => return ring.finish(mem, &request, spec::S_IOERR),
        };
        let q = ring.clone();
        let held = mem.clone();
        let meta = request.clone();
        let refused = self
            .engine
            .submit_with(io, move |_ctx, _engine, done: Completion| {
                let mut status = if done.result.is_ok() {
                    spec::S_OK
                } else {
                    spec::S_IOERR
                };
                if let (BlkOp::Read { segments, .. }, IoBuffers::One(buf)) = (&meta.op, &done.buf) {
                    if status == spec::S_OK && !copy_to_guest(&held, segments, buf) {
                        status = spec::S_IOERR;
                    }
                }
                q.finish(&held, &meta, status);
            });
        if refused.is_err() {
            ring.finish(mem, &request, spec::S_IOERR);
        }
    }
}

/// The host addresses of `segments` in `mem` (each may span regions), or None if one is not
/// mapped (the chain parser checked it; a new table could not have been swapped in since,
/// since `mem` is the table the chain was parsed against).
fn guest_iovecs(mem: &GuestMemory, segments: &[Segment]) -> Option<GuestIovecs> {
    let mut parts = Vec::with_capacity(segments.len());
    for s in segments {
        for slice in mem.get_slices(s.addr, s.len as usize) {
            let slice = slice.ok()?;
            parts.push((slice.ptr_guard_mut().as_ptr(), slice.len()));
        }
    }
    // SAFETY: every segment lies in a mapping of `mem`; the request's completion callback
    // holds a clone of `mem` (an `Arc` of the mappings), and the engine holds the iovecs
    // until that completion, so the memory stays mapped while the kernel may touch it. This
    // process never makes Rust references to guest memory (vm-memory's accesses are
    // volatile), so the driver writing its own buffer meanwhile is a race only for the guest.
    Some(unsafe { GuestIovecs::new(parts) })
}

/// Copies a bounce buffer into the read's segments.
fn copy_to_guest(mem: &GuestMemory, segments: &[Segment], buf: &AlignedBuf) -> bool {
    let mut at = 0usize;
    for s in segments {
        let end = at + s.len as usize;
        let Some(part) = buf.get(at..end) else {
            return false;
        };
        if mem.write_slice(part, s.addr).is_err() {
            return false;
        }
        at = end;
    }
    true
}
