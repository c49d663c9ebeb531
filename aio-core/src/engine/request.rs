//! Requests, completions and the shared transfer arithmetic every engine uses.
//!
//! This module owns the value types of the engine contract ([`IoFile`], [`Request`], [`Op`],
//! [`Completion`], [`IoBuffers`]), request validation ([`RequestError`]) and [`Transfer`], the
//! bookkeeping for resubmitting the remainder of a short read or write. It performs no I/O.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use super::buf::AlignedBuf;

/// A file that requests refer to. Cloning is cheap; every request holds a clone, so the fd
/// stays open while any request on it is in flight, whatever the caller does with its own
/// handle.
#[derive(Clone)]
pub struct IoFile {
    fd: Arc<OwnedFd>,
    /// O_DIRECT as the fd was when this `IoFile` was made (read once, not per request).
    direct: bool,
}

impl fmt::Debug for IoFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IoFile(fd {})", self.fd.as_raw_fd())
    }
}

impl IoFile {
    /// Takes ownership of an open fd (e.g. from `File::into()`).
    pub fn new(fd: impl Into<OwnedFd>) -> Self {
        let fd: OwnedFd = fd.into();
        // SAFETY: F_GETFL reads the status flags of an fd we own; it takes no pointer.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        IoFile {
            fd: Arc::new(fd),
            direct: flags >= 0 && flags & libc::O_DIRECT != 0,
        }
    }

    /// Duplicates (close-on-exec) an fd that the caller keeps owning: requests then hold the
    /// duplicate, whatever the caller does with its own. Fails only when the process is out of
    /// descriptors (`EMFILE`).
    pub fn dup(fd: impl AsFd) -> io::Result<Self> {
        Ok(IoFile::new(fd.as_fd().try_clone_to_owned()?))
    }

    /// The raw fd (valid while this `IoFile` or a clone lives).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether the fd was opened with `O_DIRECT`, as read once when this `IoFile` was made
    /// (a later `fcntl(F_SETFL)` on the fd is not seen). Engines use it to tell buffered I/O
    /// apart without a syscall per request.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl AsFd for IoFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<std::fs::File> for IoFile {
    fn from(f: std::fs::File) -> Self {
        IoFile::new(f)
    }
}

/// What a request does.
#[derive(Debug)]
pub enum Op {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    Read {
        /// File offset.
        offset: u64,
        /// Destination; its length is the request size.
        buf: AlignedBuf,
    },
    /// Write `buf` at `offset`.
    Write {
        /// File offset.
        offset: u64,
        /// Source.
        buf: AlignedBuf,
    },
    /// Read into several buffers, in order, starting at `offset`.
    Readv {
        /// File offset.
        offset: u64,
        /// Destinations.
        bufs: Vec<AlignedBuf>,
    },
    /// Write several buffers, in order, starting at `offset`.
    Writev {
        /// File offset.
        offset: u64,
        /// Sources.
        bufs: Vec<AlignedBuf>,
    },
    /// `fsync(2)`.
    Fsync,
    /// `fdatasync(2)`.
    Fdatasync,
}

impl Op {
    /// A short name for messages: `"read"`, `"writev"`, `"fsync"`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Readv { .. } => "readv",
            Op::Writev { .. } => "writev",
            Op::Fsync => "fsync",
            Op::Fdatasync => "fdatasync",
        }
    }

    /// Whether the op moves data from the file into memory.
    pub fn is_read(&self) -> bool {
        matches!(self, Op::Read { .. } | Op::Readv { .. })
    }

    /// The file offset (0 for syncs).
    pub fn offset(&self) -> u64 {
        match self {
            Op::Read { offset, .. }
            | Op::Write { offset, .. }
            | Op::Readv { offset, .. }
            | Op::Writev { offset, .. } => *offset,
            Op::Fsync | Op::Fdatasync => 0,
        }
    }

    /// Total bytes the request transfers (0 for syncs).
    pub fn len(&self) -> usize {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => buf.len(),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs.iter().map(|b| b.len()).sum(),
            Op::Fsync | Op::Fdatasync => 0,
        }
    }

    /// Whether the request transfers no bytes (syncs; data ops are refused when empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves the buffers out, leaving the op without them.
    pub fn into_buffers(self) -> IoBuffers {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => IoBuffers::One(buf),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => IoBuffers::Many(bufs),
            Op::Fsync | Op::Fdatasync => IoBuffers::None,
        }
    }

    /// The buffers, mutably, in transfer order.
    pub fn buffers_mut(&mut self) -> &mut [AlignedBuf] {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => std::slice::from_mut(buf),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs,
            Op::Fsync | Op::Fdatasync => &mut [],
        }
    }
}

/// One block I/O request: a file, an op, and a caller-chosen token echoed in its completion.
#[derive(Debug)]
pub struct Request {
    /// The file.
    pub file: IoFile,
    /// What to do.
    pub op: Op,
    /// The caller's id for this request, returned in its [`Completion`].
    pub token: u64,
}

impl Request {
    /// A read of `buf.len()` bytes at `offset`.
    pub fn read(file: &IoFile, offset: u64, buf: AlignedBuf, token: u64) -> Self {
        Request {
            file: file.clone(),
            op: Op::Read { offset, buf },
            token,
        }
    }

    /// A write of `buf` at `offset`.
    pub fn write(file: &IoFile, offset: u64, buf: AlignedBuf, token: u64) -> Self {
        Request {
            file: file.clone(),
            op: Op::Write { offset, buf },
            token,
        }
    }

    /// A vectored read at `offset`.
    pub fn readv(file: &IoFile, offset: u64, bufs: Vec<AlignedBuf>, token: u64) -> Self {
        Request {
            file: file.clone(),
            op: Op::Readv { offset, bufs },
            token,
        }
    }

    /// A vectored write at `offset`.
    pub fn writev(file: &IoFile, offset: u64, bufs: Vec<AlignedBuf>, token: u64) -> Self {
        Request {
            file: file.clone(),
            op: Op::Writev { offset, bufs },
            token,
        }
    }

    /// `fsync(2)` of the file.
    pub fn fsync(file: &IoFile, token: u64) -> Self {
        Request {
            file: file.clone(),
            op: Op::Fsync,
            token,
        }
    }

    /// `fdatasync(2)` of the file.
    pub fn fdatasync(file: &IoFile, token: u64) -> Self {
        Request {
            file: file.clone(),
            op: Op::Fdatasync,
            token,
        }
    }

    /// Checks what can be checked without the kernel: non-empty data ops, at most
    /// `IOV_MAX` buffers, offsets and lengths that fit the kernel's signed 64-bit `loff_t`.
    pub fn validate(&self) -> Result<(), RequestError> {
        let op = &self.op;
        if matches!(op, Op::Fsync | Op::Fdatasync) {
            return Ok(());
        }
        if let Op::Readv { bufs, .. } | Op::Writev { bufs, .. } = op {
            if bufs.len() > IOV_MAX {
                return Err(RequestError::TooManyBuffers { count: bufs.len() });
            }
        }
        let len = op.len();
        if len == 0 {
            return Err(RequestError::ZeroLength { op: op.name() });
        }
        let offset = op.offset();
        let end = offset.checked_add(len as u64);
        if offset > i64::MAX as u64 || end.is_none_or(|e| e > i64::MAX as u64) {
            return Err(RequestError::OffsetOutOfRange { offset, len });
        }
        Ok(())
    }

    /// Completes this request without running it: the buffers go back with `result`.
    pub fn complete(self, result: io::Result<usize>) -> Completion {
        Completion {
            token: self.token,
            result,
            buf: self.op.into_buffers(),
        }
    }
}

/// The kernel's limit on buffers per vectored request.
pub const IOV_MAX: usize = 1024;

/// The buffers of a request, handed back in its completion.
#[derive(Debug, Default)]
pub enum IoBuffers {
    /// A sync has none.
    #[default]
    None,
    /// A read or write.
    One(AlignedBuf),
    /// A readv or writev.
    Many(Vec<AlignedBuf>),
}

impl IoBuffers {
    /// The single buffer of a read or write.
    pub fn into_one(self) -> Option<AlignedBuf> {
        match self {
            IoBuffers::One(b) => Some(b),
            _ => None,
        }
    }

    /// All buffers, in order (empty for a sync).
    pub fn into_vec(self) -> Vec<AlignedBuf> {
        match self {
            IoBuffers::None => Vec::new(),
            IoBuffers::One(b) => vec![b],
            IoBuffers::Many(v) => v,
        }
    }

    /// The first (for a read or write, the only) buffer.
    pub fn first(&self) -> Option<&AlignedBuf> {
        match self {
            IoBuffers::None => None,
            IoBuffers::One(b) => Some(b),
            IoBuffers::Many(v) => v.first(),
        }
    }

    /// How many buffers there are.
    pub fn count(&self) -> usize {
        match self {
            IoBuffers::None => 0,
            IoBuffers::One(_) => 1,
            IoBuffers::Many(v) => v.len(),
        }
    }
}

/// The end of a request: its token, the bytes transferred (or the error, carrying the errno),
/// and its buffers back.
#[derive(Debug)]
pub struct Completion {
    /// The request's token.
    pub token: u64,
    /// Bytes transferred (less than requested only for a read that reached end of file; 0
    /// for syncs and for reads at or past EOF), or the error.
    pub result: io::Result<usize>,
    /// The request's buffers.
    pub buf: IoBuffers,
}

impl Completion {
    /// The errno of a failed request.
    pub fn errno(&self) -> Option<i32> {
        self.result.as_ref().err().and_then(|e| e.raw_os_error())
    }
}

/// A request refused before it reached the kernel or a worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A read or write with no bytes.
    #[error("{op} of zero bytes")]
    ZeroLength {
        /// The op's name.
        op: &'static str,
    },
    /// An offset or end beyond `i64::MAX` (the kernel's `loff_t`).
    #[error("offset {offset} + length {len} is beyond the largest file offset (i64::MAX)")]
    OffsetOutOfRange {
        /// The offset.
        offset: u64,
        /// The length.
        len: usize,
    },
    /// More buffers than `IOV_MAX`.
    #[error("{count} buffers in one vectored request (the limit is {IOV_MAX})")]
    TooManyBuffers {
        /// How many were given.
        count: usize,
    },
    /// The engine was shut down.
    #[error("the {engine} engine is shut down")]
    ShutDown {
        /// The engine's name.
        engine: &'static str,
    },
    /// The engine does not support this op here (with the reason).
    #[error("{engine} cannot run {op}: {reason}")]
    Unsupported {
        /// The engine's name.
        engine: &'static str,
        /// The op's name.
        op: &'static str,
        /// Why.
        reason: String,
    },
}

crate::io_error_from!(RequestError, |e| match e {
    RequestError::ShutDown { .. } => io::ErrorKind::BrokenPipe,
    RequestError::Unsupported { .. } => io::ErrorKind::Unsupported,
    _ => io::ErrorKind::InvalidInput,
});

/// A refused request, with the request (and so its buffers) handed back.
#[derive(Debug, thiserror::Error)]
#[error("request {} refused: {error}", request.token)]
pub struct SubmitError {
    /// Why.
    #[source]
    pub error: RequestError,
    /// The request, untouched.
    pub request: Box<Request>,
}

impl SubmitError {
    /// Wraps a refusal.
    pub fn new(error: RequestError, request: Request) -> Self {
        SubmitError {
            error,
            request: Box::new(request),
        }
    }
}

impl From<SubmitError> for io::Error {
    fn from(e: SubmitError) -> io::Error {
        e.error.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_direct_follows_the_open_flags() {
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::env::temp_dir().join(format!("aio-core-direct-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let buffered = IoFile::from(std::fs::File::open(&path).unwrap());
        assert!(!buffered.is_direct());
        // The engine tests need O_DIRECT in the temp dir too (README, Tests).
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("O_DIRECT in the system temp dir");
        let direct = IoFile::from(direct);
        assert!(direct.is_direct());
        assert!(direct.clone().is_direct(), "clones share it");
        std::fs::remove_file(&path).unwrap();
    }

    fn file() -> IoFile {
        IoFile::dup(std::fs::File::open("/dev/null").expect("/dev/null")).expect("dup")
    }

    #[test]
    fn validation() {
        let f = file();
        assert!(matches!(
            Request::read(&f, 0, AlignedBuf::new(0), 1).validate(),
            Err(RequestError::ZeroLength { op: "read" })
        ));
        assert!(matches!(
            Request::write(&f, i64::MAX as u64, AlignedBuf::new(1), 1).validate(),
            Err(RequestError::OffsetOutOfRange { .. })
        ));
        assert!(matches!(
            Request::write(&f, u64::MAX, AlignedBuf::new(1), 1).validate(),
            Err(RequestError::OffsetOutOfRange { .. })
        ));
        assert!(Request::read(&f, 4096, AlignedBuf::new(512), 1)
            .validate()
            .is_ok());
        assert!(Request::fsync(&f, 1).validate().is_ok());
        let many = (0..IOV_MAX + 1).map(|_| AlignedBuf::new(1)).collect();
        assert!(matches!(
            Request::readv(&f, 0, many, 1).validate(),
            Err(RequestError::TooManyBuffers { .. })
        ));
        let e: io::Error = RequestError::ZeroLength { op: "read" }.into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
