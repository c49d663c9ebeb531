//! A raw image: a file or block device (or a window of one), its sectors at their own offsets.
//!
//! This module owns the request -> engine request mapping of a raw image (reads and writes
//! straight into and out of the caller's memory, a bounce buffer when that memory is
//! misaligned for `O_DIRECT`, FUA as `RWF_DSYNC`), the probed-image rule, and resizing the
//! file. It never opens the file: [`Image`](super::Image) does, and locks it.
//!
//! * A probed raw image (`format=auto`) refuses a write that would put a known format's magic
//!   into sector 0 (`EPERM`), as QEMU's raw driver does for a probed image: the next open
//!   would take the image for that format.

use std::io::{self, Seek};
use std::os::fd::AsFd;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Mutex, PoisonError};

use aio_core::engine::{AlignedBuf, FileKind, IoBuffers, IoEngine, LentMemory};
use aio_core::engine::{IoFile, Request, RequestError, RwFlags};
use aio_core::EventLoop;
use aio_loop::AioContext;

use super::driver::{Driver, QueueIo};
use super::error::{ActivationError, ResizeError};
use super::options::ImageOptions;
use crate::bitmap::BitmapSet;
use crate::format;
use crate::lock::{Access, ImageLock, LockError};
use crate::request::{BlockRequest, Reply};
use crate::status::{self, Extent};

/// A raw file or block device, from `offset`.
#[derive(Debug)]
pub(crate) struct RawFile {
    file: IoFile,
    offset: u64,
    /// Its format was found by probing (`format=auto`): a write must not give sector 0 a
    /// known format's magic.
    probed: bool,
    /// A [window](super::Image::window): its size is the one given, never resized.
    window: bool,
    /// The image's locks while it is active (none for a window: its file is the caller's;
    /// none while inactive).
    lock: Mutex<Option<ImageLock>>,
}

impl RawFile {
    /// A whole file, locked by `lock` (None: inactive).
    pub(crate) fn whole(file: IoFile, probed: bool, lock: Option<ImageLock>) -> Self {
        RawFile {
            file,
            offset: 0,
            probed,
            window: false,
            lock: Mutex::new(lock),
        }
    }

    /// A window from `offset` of a file the caller opened (and locks).
    pub(crate) fn window(file: IoFile, offset: u64) -> Self {
        RawFile {
            file,
            offset,
            probed: false,
            window: true,
            lock: Mutex::new(None),
        }
    }

    pub(crate) fn file(&self) -> &IoFile {
        &self.file
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// A duplicate of the fd as a `File` (the same open file description): the image's own
    /// fd stays the engine's.
    fn dup(&self) -> io::Result<std::fs::File> {
        Ok(std::fs::File::from(self.file.as_fd().try_clone_to_owned()?))
    }
}

/// Whether `buffers`, written at byte 0, would start with a known format's magic.
pub(super) fn writes_format_magic(buffers: &LentMemory) -> bool {
    let mut head = [0u8; format::PROBE_BYTES];
    let n = buffers.copy_out(&mut head);
    format::probe(&head[..n]).is_some()
}

impl Driver for RawFile {
    fn format_name(&self) -> &'static str {
        "raw"
    }

    /// The file's data and holes (`SEEK_DATA` / `SEEK_HOLE`), a window's shifted to it.
    fn block_status(&self, offset: u64, len: u64, size: u64) -> io::Result<Vec<Extent>> {
        let end = self.offset + size;
        let mut extents = status::raw_extents(&self.file, end, self.offset + offset, len)?;
        for e in &mut extents {
            e.offset -= self.offset;
        }
        Ok(extents)
    }

    fn read_blocking(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        crate::blocking::read_at(&self.file, buf, self.offset + offset)
    }

    fn write_blocking(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        crate::blocking::write_at(&self.file, buf, self.offset + offset)
    }

    fn write_zeroes_blocking(&self, offset: u64, len: u64) -> io::Result<()> {
        let align = self.file.direct_io_alignment().map_or(1, |a| a.offset);
        crate::blocking::write_zeroes(&self.file, self.offset + offset, len, align)
    }

    fn flush_blocking(&self) -> io::Result<()> {
        crate::blocking::fdatasync(&self.file)
    }

    /// Syncs the file (the device's cache written) and lets its lock go: a raw image caches
    /// nothing else.
    fn inactivate(&self, path: &Path, _bitmaps: &BitmapSet) -> Result<(), ActivationError> {
        let flushed = self.dup().and_then(|dup| dup.sync_data());
        flushed.map_err(|source| ActivationError::Flush {
            path: path.to_path_buf(),
            source,
        })?;
        self.lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Ok(())
    }

    /// Takes the lock a served disk holds on the image's own file description (a window's
    /// file is the caller's to lock), and reads its size again (another user may have
    /// resized it).
    fn activate(
        &self,
        path: &Path,
        options: &ImageOptions,
    ) -> Result<Option<u64>, ActivationError> {
        if self.window {
            return Ok(None);
        }
        let io_error = |source| LockError::Io {
            path: path.to_path_buf(),
            source,
        };
        let dup = self.dup().map_err(io_error)?;
        let access = Access::disk(!options.read_only, options.share_rw);
        let lock = ImageLock::acquire(&dup, path, access, options.locking)?;
        let bytes = (&dup).seek(io::SeekFrom::End(0)).map_err(io_error)?;
        *self.lock.lock().unwrap_or_else(PoisonError::into_inner) = Some(lock);
        Ok(Some(bytes))
    }

    fn resize(&self, bytes: u64, old: u64) -> Result<(), ResizeError> {
        if self.window {
            return Err(ResizeError::Window {
                offset: self.offset,
                bytes: old,
            });
        }
        let dup = self.dup().map_err(ResizeError::Io)?;
        if self.file.kind() == FileKind::BlockDevice {
            let device_bytes = (&dup).seek(io::SeekFrom::End(0)).map_err(ResizeError::Io)?;
            return match bytes <= device_bytes {
                true => Ok(()),
                false => Err(ResizeError::DeviceTooSmall {
                    bytes,
                    device_bytes,
                }),
            };
        }
        dup.set_len(bytes).map_err(ResizeError::Io)
    }

    fn submit<L, E, R>(
        &self,
        queue: &QueueIo<L, E>,
        _ctx: &AioContext<L>,
        reply: &Rc<R>,
        request: BlockRequest,
        tag: R::Tag,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
        R: Reply,
    {
        let (io, discard) = match self.engine_request(request) {
            Ok(mapped) => mapped,
            Err(refused) => return reply.finish(tag, Err(refused)),
        };
        let fua = io.flags.contains(RwFlags::FUA);
        let state = (reply.clone(), tag);
        let submitted = queue
            .engine
            .try_submit_with(io, state, move |_, _, c, state| {
                let (reply, tag) = state;
                // The engine is done with the memory: it (and its hold) goes before the caller
                // hears.
                let result = outcome(c.result, discard);
                drop(c.buf);
                reply.finish(tag, result);
            });
        let Err((refused, (reply, tag))) = submitted else {
            return;
        };
        // The caller's memory is misaligned for `O_DIRECT`: through a bounce buffer. The
        // refusal hands the request back with its memory untouched.
        let misaligned = matches!(refused.error, RequestError::Misaligned { .. });
        let Request { op, .. } = *refused.request;
        let (offset, write) = (op.offset(), op.is_write());
        match (misaligned, op.into_buffers()) {
            (true, IoBuffers::Guest(mem)) => {
                reply.bounced();
                self.bounce(queue, reply, tag, mem, offset, write, fua);
            }
            (_, buffers) => {
                drop(buffers);
                reply.finish(tag, Err(refused.error.into()));
            }
        }
    }
}

impl RawFile {
    /// The engine request that does `request` (its memory inside, with the memory's hold) and
    /// whether it is a discard; or why it is refused (a probed image's format header).
    fn engine_request(&self, request: BlockRequest) -> io::Result<(Request, bool)> {
        let file = &self.file;
        let at = |offset: u64| offset + self.offset;
        Ok(match request {
            BlockRequest::Read { offset, buffers } => {
                (Request::read_guest(file, at(offset), buffers, 0), false)
            }
            BlockRequest::Write {
                offset,
                buffers,
                fua,
            } => {
                if self.probed && offset == 0 && writes_format_magic(&buffers) {
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
                let mut io = Request::write_guest(file, at(offset), buffers, 0);
                if fua {
                    io = io.with_flags(RwFlags::FUA);
                }
                (io, false)
            }
            BlockRequest::Flush => (Request::fdatasync(file, 0), false),
            BlockRequest::Discard { offset, len } => {
                (Request::discard(file, at(offset), len, 0), true)
            }
            BlockRequest::WriteZeroes { offset, len, unmap } => {
                let io = Request::write_zeroes(file, at(offset), len, unmap, 0);
                (io, false)
            }
        })
    }

    /// A read or write at file `offset` through an aligned buffer: copied from the caller's
    /// memory before a write, into it after a read.
    #[allow(clippy::too_many_arguments)]
    fn bounce<L, E, R>(
        &self,
        queue: &QueueIo<L, E>,
        reply: Rc<R>,
        tag: R::Tag,
        mem: LentMemory,
        offset: u64,
        write: bool,
        fua: bool,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
        R: Reply,
    {
        let mut buf = AlignedBuf::new(mem.len());
        let io = if write {
            mem.copy_out(&mut buf[..]);
            // Written from the copy: the caller's memory is free now.
            drop(mem);
            let io = Request::write(&self.file, offset, buf, 0);
            let flags = if fua { RwFlags::FUA } else { RwFlags::NONE };
            (io.with_flags(flags), None)
        } else {
            (Request::read(&self.file, offset, buf, 0), Some(mem))
        };
        let (io, target) = io;
        let state = (reply, tag, target);
        let submitted = queue
            .engine
            .try_submit_with(io, state, move |_, _, c, state| {
                let (reply, tag, target) = state;
                let mut result = outcome(c.result, false);
                if let (true, Some(mut mem), IoBuffers::One(buf)) = (result.is_ok(), target, c.buf)
                {
                    let n = mem.copy_in(&buf[..]);
                    drop(mem);
                    if n < buf.len() {
                        result = Err(io::Error::other(
                            "a bounced read's memory is shorter than it",
                        ));
                    }
                }
                reply.finish(tag, result);
            });
        if let Err((refused, (reply, tag, target))) = submitted {
            drop(target);
            reply.finish(tag, Err(refused.error.into()));
        }
    }
}

/// A request's result: a discard the file or device cannot do is not an error.
fn outcome(result: io::Result<usize>, discard: bool) -> io::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if discard && e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
        Err(e) => Err(e),
    }
}
