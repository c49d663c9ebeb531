//! A request's execution on its backing store: a checked chain's op turned into engine
//! requests on the disk's image, and the engine's completion turned into a virtio-blk status.
//!
//! This module owns the op -> aio request mapping (reads and writes straight into and out of
//! guest memory, a bounce buffer when the driver's buffers are misaligned for `O_DIRECT`),
//! the status rules (a discard the image cannot do is not an error), and `GET_ID`. It never
//! touches the ring: the queue ([`crate::queue`]) takes chains and writes used elements, and is
//! told each status through [`Completer`]. This is the seam where a request meets its backing
//! store ([`Store`]): a raw file or block device through the engine, a qcow2 image through
//! `imago` on the same engine ([`crate::image`]), or nothing (the null device).
//!
//! * A probed raw image (`format=auto`) refuses a write that would put a known format's magic
//!   into sector 0, as QEMU's raw driver does for a probed image: the next open would take
//!   the disk for that format.

use std::rc::Rc;
use std::sync::Arc;

use aio_core::engine::{AlignedBuf, AttachedEngine, Completion, GuestIovecs, IoBuffers, IoEngine};
use aio_core::engine::{Request, RequestError};
use aio_core::{AioContext, EventLoop};
use vm_memory::{Address, Bytes, GuestMemoryBackend};

use crate::chain::{BlkOp, BlkRequest, Segment};
use crate::device::{Backing, BlockDevice};
use crate::queue::GuestMemory;
use crate::{format, spec};

/// The ring side of a request: told once, with the request's status, when it is done.
pub(crate) trait Completer: 'static {
    /// `request` is done with `status`; `mem` is the memory table it was parsed against.
    fn finish(&self, mem: &GuestMemory, request: &BlkRequest, status: u8);
    /// `request` went through a bounce buffer (for the queue's counters).
    fn bounced(&self);
}

/// A disk's requests served on one queue's context: through `engine` for a raw image, through
/// imago on the same engine for a qcow2 image, at once for the null device.
pub(crate) struct Store<L: EventLoop + 'static, E: IoEngine + 'static> {
    device: Arc<BlockDevice>,
    engine: AttachedEngine<L, E>,
    /// The same engine, as a qcow2 image's storage reaches it.
    #[cfg(feature = "qcow2")]
    image_engine: Rc<dyn crate::image::ImageEngine>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Store<L, E> {
    pub(crate) fn new(device: Arc<BlockDevice>, engine: AttachedEngine<L, E>) -> Self {
        Store {
            device,
            #[cfg(feature = "qcow2")]
            image_engine: Rc::new(engine.clone()),
            engine,
        }
    }

    /// The disk.
    pub(crate) fn device(&self) -> &BlockDevice {
        &self.device
    }

    /// Holds the engine's submissions until [`finish_batch`](Self::finish_batch): one batch
    /// per kick.
    pub(crate) fn plug(&self) {
        self.engine.plug();
    }

    /// Sends the batch held since [`plug`](Self::plug). A qcow2 image's requests run as tasks:
    /// they take their first steps now, inside the batch, so that their I/O goes with it.
    pub(crate) fn finish_batch(&self, ctx: &AioContext<L>) {
        #[cfg(feature = "qcow2")]
        if matches!(self.device.backing(), Backing::Qcow2(_)) {
            ctx.run_woken_tasks();
        }
        #[cfg(not(feature = "qcow2"))]
        let _ = ctx;
        self.engine.unplug();
    }

    /// Readies what the batch's requests will look up first (a qcow2 image's direct path).
    pub(crate) fn prefetch<'r>(&self, requests: impl Iterator<Item = &'r BlkRequest>) {
        #[cfg(feature = "qcow2")]
        if let Backing::Qcow2(image) = self.device.backing() {
            image.prefetch(requests);
        }
        #[cfg(not(feature = "qcow2"))]
        let _ = requests;
    }

    /// Runs `request` and tells `ring` its status, now (`GET_ID`, a refusal, the null
    /// device) or when its I/O completes.
    pub(crate) fn execute<C: Completer>(
        &self,
        ctx: &AioContext<L>,
        ring: &Rc<C>,
        mem: &GuestMemory,
        request: BlkRequest,
    ) {
        if let BlkOp::GetId { buf } = &request.op {
            let ok = mem.write_slice(&self.device.id_bytes(), buf.addr).is_ok();
            let status = if ok { spec::S_OK } else { spec::S_IOERR };
            return ring.finish(mem, &request, status);
        }
        match self.device.backing() {
            Backing::Raw {
                file,
                offset,
                probed,
                ..
            } => {
                let raw = RawImage {
                    file,
                    offset: *offset,
                    engine: &self.engine,
                };
                if *probed && writes_format_magic(mem, &request.op) {
                    return ring.finish(mem, &request, spec::S_IOERR);
                }
                raw.execute(ring, mem, request);
            }
            Backing::Null => {
                let status = null_status(mem, &request.op);
                ring.finish(mem, &request, status);
            }
            #[cfg(feature = "qcow2")]
            Backing::Qcow2(image) => {
                if let Err(request) = image.try_direct(&self.engine, ring, mem, request) {
                    crate::image::execute(ctx, image, &self.image_engine, ring, mem, request)
                }
            }
        }
        #[cfg(not(feature = "qcow2"))]
        let _ = ctx;
    }
}

/// Whether `op` writes sector 0 with data whose first bytes are a known format's magic.
fn writes_format_magic(mem: &GuestMemory, op: &BlkOp) -> bool {
    let BlkOp::Write {
        offset: 0,
        segments,
    } = op
    else {
        return false;
    };
    let mut head = [0u8; format::PROBE_BYTES];
    let mut at = 0;
    for s in segments {
        let n = (s.len as usize).min(head.len() - at);
        if n == 0 {
            break;
        }
        if mem.read_slice(&mut head[at..at + n], s.addr).is_err() {
            return true; // Unreadable: refused anyway.
        }
        at += n;
    }
    format::probe(&head[..at]).is_some()
}

/// The null device: a read fills its buffers with zeros, everything else succeeds.
fn null_status(mem: &GuestMemory, op: &BlkOp) -> u8 {
    static ZEROS: [u8; 4096] = [0; 4096];
    if let BlkOp::Read { segments, .. } = op {
        for s in segments {
            let mut done = 0usize;
            while done < s.len as usize {
                let n = (s.len as usize - done).min(ZEROS.len());
                let addr = s.addr.unchecked_add(done as u64);
                if mem.write_slice(&ZEROS[..n], addr).is_err() {
                    return spec::S_IOERR;
                }
                done += n;
            }
        }
    }
    spec::S_OK
}

/// A raw image (a file or a block device, opened by [`BlockDevice`]), from `offset`, served
/// through one engine attached to the queue's context.
struct RawImage<'a, L: EventLoop + 'static, E: IoEngine + 'static> {
    file: &'a aio_core::engine::IoFile,
    offset: u64,
    engine: &'a AttachedEngine<L, E>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> RawImage<'_, L, E> {
    /// Where the disk's byte `offset` is in the file: the chain's offsets are the disk's, and a
    /// window starts past the file's start.
    fn file_offset(&self, offset: u64) -> u64 {
        offset + self.offset
    }

    /// Runs `request` (not `GET_ID`) and tells `ring` its status, now (a refusal) or from the
    /// engine's completion.
    fn execute<C: Completer>(&self, ring: &Rc<C>, mem: &GuestMemory, request: BlkRequest) {
        let file = self.file;
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
            BlkOp::GetId { .. } => return ring.finish(mem, &request, spec::S_IOERR),
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
        let on_done = finish_on_completion(ring, mem, request.clone(), ());
        if let Err(refused) = self.engine.submit_with(io, on_done) {
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
        let file = self.file;
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

/// The completion callback of the engine request that does all of `request`: its status to
/// `ring` (a discard the file or device cannot do is not an error: discard is advisory), with
/// `mem`, the table the request was parsed against, and `keep` held until then (the kernel is
/// done with the request's memory).
pub(crate) fn finish_on_completion<L, E, C, K>(
    ring: &Rc<C>,
    mem: &GuestMemory,
    request: BlkRequest,
    keep: K,
) -> impl FnOnce(&AioContext<L>, &AttachedEngine<L, E>, Completion) + 'static
where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
    C: Completer,
    K: 'static,
{
    let (ring, mem) = (ring.clone(), mem.clone());
    move |_ctx, _engine, done| {
        let is_discard = matches!(request.op, BlkOp::Discard { .. });
        let status = match &done.result {
            Ok(_) => spec::S_OK,
            Err(e) if is_discard && e.raw_os_error() == Some(libc::EOPNOTSUPP) => spec::S_OK,
            Err(_) => spec::S_IOERR,
        };
        ring.finish(&mem, &request, status);
        drop(keep);
    }
}

/// The host addresses of `segments` in `mem` (each may span regions), or None if one is not
/// mapped (the chain parser checked it; a new table could not have been swapped in since,
/// since `mem` is the table the chain was parsed against).
pub(crate) fn guest_iovecs(mem: &GuestMemory, segments: &[Segment]) -> Option<GuestIovecs> {
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
