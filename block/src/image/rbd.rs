//! A raw image in a Ceph cluster: an RBD image, its sectors at their own offsets, requests
//! through librbd ([`aio_rbd`]).
//!
//! This module owns the request -> librbd mapping of an RBD disk (reads and writes straight
//! into and out of the caller's memory, FUA as a flush after the write, write-zeroes thick
//! unless unmapping is allowed), its block status and its resize; opening it (the format
//! rule, the exclusive lock) is `rbd_open.rs`'s, which names the image this part never does. Each queue's requests run on that queue's own [`RbdQueue`], so
//! their ends come back to the queue's context.
//!
//! * A probed image (`format=auto`) is raw unless its first sector says otherwise: a qcow2
//!   header is served as qcow2 (its storage librbd's: `qcow2/rbd_storage.rs`; no backing
//!   file), another known format is refused, as for a file, and a write that would put a known
//!   format's magic into sector 0 of a raw image is `EPERM`.
//! * A writable image takes librbd's exclusive lock (unless `locking=off` or `share-rw=on`):
//!   a second writer is refused, naming the holder.
//! * Inactive ([`Image::open_rbd_inactive`], [`Image::inactivate`]): the exclusive lock is not
//!   held (librbd's cache flushed and the lock released on inactivation), and activation
//!   takes it, drops librbd's cache and reads the size again.

use std::io;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_rbd::{LockRecords, LockTaken, RbdImage, RbdQueue};

use super::driver::{Driver, QueueIo, StatusDone};
use super::error::{ActivationError, ResizeError};
use super::options::ImageOptions;
use crate::bitmap::BitmapSet;
use crate::lock::LockMode;
use crate::request::{BlockRequest, Reply};
use crate::status::{self, Extent, ExtentKind};

/// An RBD image served raw.
#[derive(Debug)]
pub(crate) struct RbdDisk {
    pub(super) image: Arc<RbdImage>,
    /// Its format was found by probing: a write must not give sector 0 a known format's magic.
    pub(super) probed: bool,
    /// What taking the exclusive lock did (None: not taken, the image is not written alone,
    /// or inactive).
    pub(super) lock: Mutex<Option<LockTaken>>,
    /// What lets this process break its dead predecessor's lock, for activation.
    pub(super) records: Option<LockRecords>,
}

/// Whether an image opened with `options` takes the exclusive lock: a writer, unless it
/// shares writing (`share-rw=on`, where `may_share`: a qcow2 image's metadata has one writer,
/// so never for it) or takes no lock (`locking=off`).
pub(super) fn writes_alone(options: &ImageOptions, may_share: bool) -> bool {
    let shared = may_share && options.share_rw;
    !options.read_only && !shared && options.locking != LockMode::Off
}

impl RbdDisk {
    /// The queue's own librbd queue, made on its first request.
    fn queue<'q, L, E>(&self, io: &'q QueueIo<L, E>, ctx: &AioContext<L>) -> &'q RbdQueue
    where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
    {
        io.rbd
            .get_or_init(|| RbdQueue::new(self.image.clone(), ctx))
    }
}

/// How much of `[offset, offset + len)` lies inside an image of `size` bytes.
fn inside(offset: u64, len: u64, size: u64) -> u64 {
    offset.saturating_add(len).min(size).saturating_sub(offset)
}

/// Extents of `[offset, offset + len)` from the allocated ones; the rest are holes.
fn extents_of(allocated: &[(u64, u64)], offset: u64, len: u64) -> Vec<Extent> {
    let mut out = Vec::new();
    let mut at = offset;
    for &(o, l) in allocated {
        status::push(&mut out, at, o - at, ExtentKind::Hole);
        status::push(&mut out, o, l, ExtentKind::Data);
        at = o + l;
    }
    status::push(&mut out, at, offset + len - at, ExtentKind::Hole);
    out
}

impl Driver for RbdDisk {
    fn format_name(&self) -> &'static str {
        "raw"
    }

    fn close(&self) -> io::Result<()> {
        self.image.close().map_err(io::Error::from)
    }

    /// Flushes librbd's cache and releases the exclusive lock (librbd counts its requests:
    /// any in flight is the caller's, refused).
    fn inactivate(&self, path: &Path, _bitmaps: &BitmapSet) -> Result<(), ActivationError> {
        if self.image.in_flight() > 0 {
            return Err(ActivationError::InFlight {
                path: path.to_path_buf(),
            });
        }
        self.image.flush()?;
        self.image.release_lock()?;
        self.lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Ok(())
    }

    /// Takes the exclusive lock as opening does, drops librbd's cache (another client wrote
    /// meanwhile) and reads the size again.
    fn activate(
        &self,
        _path: &Path,
        options: &ImageOptions,
    ) -> Result<Option<u64>, ActivationError> {
        let taken = match writes_alone(options, true) {
            true => Some(self.image.lock_exclusive(self.records.as_ref())?),
            false => None,
        };
        let fresh = self
            .image
            .invalidate_cache()
            .and_then(|()| self.image.size());
        let bytes = match fresh {
            Ok(bytes) => bytes,
            Err(e) => {
                if taken.is_some() {
                    let _ = self.image.release_lock();
                }
                return Err(e.into());
            }
        };
        *self.lock.lock().unwrap_or_else(PoisonError::into_inner) = taken;
        Ok(Some(bytes))
    }

    /// librbd's allocated objects (whole objects: any byte written makes its object data);
    /// past `size` a hole.
    fn block_status(&self, offset: u64, len: u64, size: u64) -> io::Result<Vec<Extent>> {
        let allocated = match inside(offset, len, size) {
            0 => Vec::new(),
            n => self.image.allocated(offset, n)?,
        };
        Ok(extents_of(&allocated, offset, len))
    }

    fn block_status_on<L, E>(
        &self,
        io: &QueueIo<L, E>,
        ctx: &AioContext<L>,
        (offset, len, size): (u64, u64, u64),
        done: StatusDone,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
    {
        let inside = inside(offset, len, size);
        if inside == 0 {
            return done(Ok(extents_of(&[], offset, len)));
        }
        self.queue(io, ctx).allocated(offset, inside, move |r| {
            done(
                r.map(|a| extents_of(&a, offset, len))
                    .map_err(io::Error::from),
            )
        });
    }

    fn resize(&self, bytes: u64, _old: u64) -> Result<(), ResizeError> {
        self.image
            .resize(bytes)
            .map_err(|e| ResizeError::Io(io::Error::from(e)))
    }

    fn submit<L, E, R>(
        &self,
        io: &QueueIo<L, E>,
        ctx: &AioContext<L>,
        reply: &Rc<R>,
        request: BlockRequest,
        tag: R::Tag,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
        R: Reply,
    {
        let queue = self.queue(io, ctx);
        let reply = reply.clone();
        match request {
            BlockRequest::Read { offset, buffers } => {
                let len = buffers.len();
                queue.read(offset, buffers, move |r, memory| {
                    // librbd is done with the memory: the hold goes before the caller hears.
                    drop(memory);
                    let r = r.and_then(|n| match n == len {
                        true => Ok(()),
                        // Shorter: another client shrank the image under us.
                        false => Err(io::Error::from_raw_os_error(libc::EIO)),
                    });
                    reply.finish(tag, r);
                });
            }
            BlockRequest::Write {
                offset,
                buffers,
                fua,
            } => {
                if self.probed && offset == 0 && super::raw::writes_format_magic(&buffers) {
                    return reply.finish(tag, Err(io::Error::from_raw_os_error(libc::EPERM)));
                }
                queue.write(offset, buffers, fua, move |r, memory| {
                    drop(memory);
                    reply.finish(tag, r);
                });
            }
            BlockRequest::Flush => queue.flush(move |r| reply.finish(tag, r)),
            BlockRequest::Discard { offset, len } => queue.discard(offset, len, move |r| {
                // Discard is advisory: an image that cannot is not an error.
                let r = r.or_else(|e| match e.raw_os_error() {
                    Some(libc::EOPNOTSUPP) => Ok(()),
                    _ => Err(e),
                });
                reply.finish(tag, r)
            }),
            BlockRequest::WriteZeroes { offset, len, unmap } => {
                queue.write_zeroes(offset, len, unmap, move |r| reply.finish(tag, r))
            }
        }
    }
}
