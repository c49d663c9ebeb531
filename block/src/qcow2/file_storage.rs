//! imago's `Storage` over aio-rs's engines: the file under a qcow2 image (and each file of its
//! backing chain), read and written through the engine of the queue serving the request.
//!
//! This module owns [`FileStorage`]: opening a file (`O_DIRECT`), the alignment it reports
//! to imago, the choice between the caller's memory directly and an engine-owned copy, short
//! transfers, and the count of modifying requests in flight. It never parses the format.
//!
//! * **The caller's data goes straight to the engine.** A buffer inside the current
//!   request's data segments (guest memory, a socket's buffer) is submitted as a part of that
//!   lent memory, with a clone of its hold that the engine keeps until it is done with it; a
//!   buffer of imago's own (metadata, its bounce buffers), or of memory lent without a hold,
//!   goes through an engine-owned [`AlignedBuf`], so that a dropped future never leaves the
//!   kernel writing into memory imago has freed.
//! * **Outside a request** (opening the image, the final flush) I/O is blocking syscalls on
//!   the calling thread.
//! * **No short transfers.** A short read continues where it stopped and reads zeros past the
//!   end of the file; a short write continues; writes past the end grow the file.

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

use aio_core::engine::{AlignedBuf, Completion, IoBuffers, IoFile, Request};
use imago::io_buffers::{IoVector, IoVectorMut};
use imago::storage::drivers::CommonStorageHelper;
use imago::{Storage, StorageOpenOptions};

use super::blocking;
use super::current::{self, Keep, RequestIo};
use super::settle::{Settle, WriteCounter, WriteInFlight};

/// A file (or block device) of an image, opened `O_DIRECT`, doing its I/O on the current
/// request's engine.
pub(crate) struct FileStorage {
    file: IoFile,
    path: PathBuf,
    size: AtomicU64,
    /// A regular file (not a block device): it grows as it is written past its end, and what
    /// lies past `size` reads as zeros.
    regular: bool,
    /// Buffer address alignment and offset/length alignment for `O_DIRECT`.
    mem_align: usize,
    req_align: usize,
    writable: bool,
    settle: Arc<Settle>,
    helper: CommonStorageHelper,
}

impl fmt::Debug for FileStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStorage")
            .field("path", &self.path)
            .field("size", &self.size.load(Ordering::Relaxed))
            .field("writable", &self.writable)
            .finish()
    }
}

impl fmt::Display for FileStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

impl FileStorage {
    /// Opens `path` with `O_DIRECT`, for writing when `writable`.
    pub(crate) fn open_path(path: &Path, writable: bool) -> io::Result<Self> {
        let (file, size) = crate::image::file::open_direct(path, writable)?;
        let regular = file.metadata()?.is_file();
        let file = IoFile::new(file);
        let (mem_align, req_align) = match file.direct_io_alignment() {
            Some(a) => (a.memory.max(1), a.offset.max(1)),
            None => (1, 1),
        };
        Ok(FileStorage {
            file,
            path: path.to_path_buf(),
            size: AtomicU64::new(size),
            regular,
            mem_align,
            req_align,
            writable,
            settle: Arc::default(),
            helper: CommonStorageHelper::default(),
        })
    }

    /// The file, for requests outside imago (the direct path).
    pub(crate) fn io_file(&self) -> &IoFile {
        &self.file
    }

    /// What counts a write made outside imago (the direct path) among the file's writes in
    /// flight, which imago settles before it frees a cluster.
    pub(crate) fn write_counter(&self) -> WriteCounter {
        WriteCounter(self.settle.clone())
    }

    /// Counts a write (submitted, not necessarily done) up to `end`.
    fn grew_to(&self, end: u64) {
        self.size.fetch_max(end, Ordering::Relaxed);
    }

    /// Zeroes `length` bytes at `offset` on the current request's engine (on the calling
    /// thread outside requests).
    async fn zero_range(&self, offset: u64, length: u64) -> io::Result<()> {
        self.grew_to(offset + length);
        let request = Request::write_zeroes(&self.file, offset, length, false, 0);
        match self.run_plain(request, true).await {
            Some(result) => result.map(drop),
            None => blocking::write_zeroes(&self.file, offset, length, self.req_align),
        }
    }

    /// Runs `request` on the current request's engine, counted among the writes in flight when
    /// it `modifies` the file (a part of the caller's memory carries its hold itself).
    fn run(
        &self,
        io: &RequestIo,
        request: Request,
        modifies: bool,
    ) -> impl Future<Output = Completion> {
        let keep = Keep {
            write: modifies.then(|| WriteInFlight::new(&self.settle)),
        };
        io.engine.run(request, keep)
    }

    /// Reads into the head of `bufv` once; returns how much was read and the rest.
    async fn read_once<'a>(
        &self,
        io: &RequestIo,
        bufv: IoVectorMut<'a>,
        offset: u64,
    ) -> io::Result<(usize, IoVectorMut<'a>)> {
        // SAFETY: the iovecs are used only while `bufv` is borrowed here, or copied into
        // a part of the caller's memory, lent on with its hold (see `RequestIo`).
        let iov = unsafe { bufv.as_iovec() };
        if let Some(mem) = io.caller_memory(iov) {
            let request = Request::read_guest(&self.file, offset, mem, 0);
            let n = self.run(io, request, false).await.result?;
            return Ok((n, bufv.split_tail_at(n as u64)));
        }
        let len = bufv.len() as usize;
        let done = self
            .run(
                io,
                Request::read(&self.file, offset, AlignedBuf::new(len), 0),
                false,
            )
            .await;
        let n = done.result?;
        let IoBuffers::One(buf) = done.buf else {
            return Err(io::Error::other("a read completed without its buffer"));
        };
        let (mut head, tail) = bufv.split_at(n as u64);
        head.copy_from_slice(&buf[..n]);
        Ok((n, tail))
    }

    /// Writes the head of `bufv` once; returns how much was written and the rest.
    async fn write_once<'a>(
        &self,
        io: &RequestIo,
        bufv: IoVector<'a>,
        offset: u64,
    ) -> io::Result<(usize, IoVector<'a>)> {
        // SAFETY: as in `read_once`.
        let iov = unsafe { bufv.as_iovec() };
        // Counted before it is submitted: a write that fails may still have landed in part,
        // and `pure_write_zeroes` trusts only what lies past every write ever submitted.
        self.grew_to(offset + bufv.len());
        let request = if let Some(mem) = io.caller_memory(iov) {
            Request::write_guest(&self.file, offset, mem, 0)
        } else {
            let mut data = AlignedBuf::new(bufv.len() as usize);
            bufv.copy_into_slice(&mut data[..]);
            Request::write(&self.file, offset, data, 0)
        };
        let done = self.run(io, request, true).await;
        let n = done.result?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        Ok((n, bufv.split_tail_at(n as u64)))
    }

    /// Runs a request with no buffer (sync, discard, write-zeroes).
    async fn run_plain(&self, request: Request, write: bool) -> Option<io::Result<usize>> {
        let io = current::current()?;
        Some(self.run(&io, request, write).await.result)
    }
}

impl Storage for FileStorage {
    async fn open(opts: StorageOpenOptions) -> io::Result<Self> {
        let path = opts
            .get_filename()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name given"))?;
        Self::open_path(path, opts.get_writable())
    }

    fn mem_align(&self) -> usize {
        self.mem_align
    }

    fn req_align(&self) -> usize {
        self.req_align
    }

    fn zero_align(&self) -> usize {
        self.req_align
    }

    fn discard_align(&self) -> usize {
        self.req_align
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.size.load(Ordering::Relaxed))
    }

    fn resolve_relative_path<P: AsRef<Path>>(&self, relative: P) -> io::Result<PathBuf> {
        let relative = relative.as_ref();
        if relative.is_absolute() {
            return Ok(relative.to_path_buf());
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        Ok(dir.join(relative))
    }

    fn get_filename(&self) -> Option<PathBuf> {
        Some(self.path.clone())
    }

    async unsafe fn pure_readv(
        &self,
        mut bufv: IoVectorMut<'_>,
        mut offset: u64,
    ) -> io::Result<()> {
        let Some(io) = current::current() else {
            return blocking::readv(&self.file, bufv, offset);
        };
        while !bufv.is_empty() {
            let (n, rest) = self.read_once(&io, bufv, offset).await?;
            bufv = rest;
            if n == 0 {
                // The end of the file: what lies beyond reads as zeros.
                bufv.fill(0);
                break;
            }
            offset += n as u64;
        }
        Ok(())
    }

    async unsafe fn pure_writev(&self, mut bufv: IoVector<'_>, mut offset: u64) -> io::Result<()> {
        let Some(io) = current::current() else {
            self.grew_to(offset + bufv.len());
            blocking::writev(&self.file, bufv, offset)?;
            return Ok(());
        };
        while !bufv.is_empty() {
            let (n, rest) = self.write_once(&io, bufv, offset).await?;
            bufv = rest;
            offset += n as u64;
        }
        Ok(())
    }

    async unsafe fn pure_write_zeroes(&self, offset: u64, length: u64) -> io::Result<()> {
        // Past the end of all the file holds and all that was written to it since it was
        // opened, a regular file reads as zeros, and stays so when a later write past the range
        // leaves it a hole: nothing to write. This is where a newly allocated cluster usually
        // lies, and imago zeroes the parts of it a write does not cover (QEMU's file driver
        // treats zeroing past the end alike). Elsewhere the range may hold old data.
        if self.regular && offset >= self.size.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.zero_range(offset, length).await
    }

    async unsafe fn pure_write_allocated_zeroes(&self, offset: u64, length: u64) -> io::Result<()> {
        // Zeroing with `fallocate(FALLOC_FL_ZERO_RANGE)` (or written zeros) leaves the range
        // allocated, past the end of the file too.
        self.zero_range(offset, length).await
    }

    async unsafe fn pure_discard(&self, offset: u64, length: u64) -> io::Result<()> {
        let request = Request::discard(&self.file, offset, length, 0);
        let result = match self.run_plain(request, true).await {
            Some(result) => result.map(drop),
            None => blocking::discard(&self.file, offset, length),
        };
        match result {
            // Discard is advisory: a file system without hole punching keeps the data.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            other => other,
        }
    }

    async fn flush(&self) -> io::Result<()> {
        // No buffers of its own: every write went to the kernel (`O_DIRECT`).
        Ok(())
    }

    async fn sync(&self) -> io::Result<()> {
        match self
            .run_plain(Request::fdatasync(&self.file, 0), false)
            .await
        {
            Some(result) => result.map(drop),
            None => blocking::fdatasync(&self.file),
        }
    }

    async fn settle_writes(&self) -> io::Result<()> {
        poll_fn(|cx| {
            let mut state = self.settle.state.lock().expect("settle lock");
            if state.0 == 0 {
                return Poll::Ready(Ok(()));
            }
            state.1.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    async unsafe fn invalidate_cache(&self) -> io::Result<()> {
        // No cache of its own.
        Ok(())
    }

    fn get_storage_helper(&self) -> &CommonStorageHelper {
        &self.helper
    }

    async fn resize(
        &self,
        new_size: u64,
        prealloc: imago::storage::PreallocateMode,
    ) -> io::Result<()> {
        if !matches!(prealloc, imago::storage::PreallocateMode::None) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        blocking::set_len(&self.file, new_size)?;
        self.size.store(new_size, Ordering::Relaxed);
        Ok(())
    }
}
