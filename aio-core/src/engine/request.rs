//! Requests: what an engine is asked to do, and the checks made before it is accepted.
//!
//! This module owns the value types of a request ([`Request`], [`Op`]), their validation
//! ([`Request::validate`]) and the refusal that hands a request back ([`SubmitError`]). It
//! performs no I/O; completions and the reasons of a refusal are in `completion.rs`, the flags
//! in `flags.rs`, the file in `file.rs`, lent memory in `lent.rs`.

use std::io;

use super::buf::AlignedBuf;
use super::completion::{Completion, IoBuffers, RequestError, IOV_MAX};
use super::file::IoFile;
use super::flags::RwFlags;
use super::lent::LentMemory;

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
    /// Read straight into caller-owned memory, in segment order, starting at `offset`.
    ReadGuest {
        /// File offset.
        offset: u64,
        /// Destinations.
        mem: LentMemory,
    },
    /// Write straight from caller-owned memory, in segment order, starting at `offset`.
    WriteGuest {
        /// File offset.
        offset: u64,
        /// Sources.
        mem: LentMemory,
    },
    /// `fsync(2)`.
    Fsync,
    /// `fdatasync(2)`.
    Fdatasync,
    /// Tells the storage that `len` bytes at `offset` are no longer needed: a file's blocks
    /// are freed (`fallocate(PUNCH_HOLE | KEEP_SIZE)`; the range then reads as zeroes and the
    /// size is kept), a block device gets `BLKDISCARD` (what the range reads afterwards is the
    /// device's business). A file system that cannot punch holes completes the request with
    /// an error of kind `Unsupported` (`EOPNOTSUPP`).
    Discard {
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Makes `len` bytes at `offset` read as zeroes without sending zeroes: a file gets
    /// `fallocate(ZERO_RANGE | KEEP_SIZE)`, or with `unmap` `fallocate(PUNCH_HOLE |
    /// KEEP_SIZE)` (the blocks are freed too); a block device gets `BLKZEROOUT`. Where
    /// neither works the request completes with an error of kind `Unsupported`; zeroes are
    /// never written behind the caller's back (write them with a [`Op::Write`] if that is
    /// what you want).
    WriteZeroes {
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Free the blocks as well (virtio-blk's `VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP`).
        unmap: bool,
    },
}

impl Op {
    /// A short name for messages: `"read"`, `"writev"`, `"discard"`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Readv { .. } => "readv",
            Op::Writev { .. } => "writev",
            Op::ReadGuest { .. } => "read-guest",
            Op::WriteGuest { .. } => "write-guest",
            Op::Fsync => "fsync",
            Op::Fdatasync => "fdatasync",
            Op::Discard { .. } => "discard",
            Op::WriteZeroes { .. } => "write-zeroes",
        }
    }

    /// Whether the op moves data from the file into memory.
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Op::Read { .. } | Op::Readv { .. } | Op::ReadGuest { .. }
        )
    }

    /// Whether the op moves data from memory into the file.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Op::Write { .. } | Op::Writev { .. } | Op::WriteGuest { .. }
        )
    }

    /// Whether the op moves data (a read or a write of any kind).
    pub fn is_data(&self) -> bool {
        self.is_read() || self.is_write()
    }

    /// Whether the op is a discard or a write-zeroes (an `fallocate`-style range op).
    pub fn is_range(&self) -> bool {
        matches!(self, Op::Discard { .. } | Op::WriteZeroes { .. })
    }

    /// The file offset (0 for syncs).
    pub fn offset(&self) -> u64 {
        match self {
            Op::Read { offset, .. }
            | Op::Write { offset, .. }
            | Op::Readv { offset, .. }
            | Op::Writev { offset, .. }
            | Op::ReadGuest { offset, .. }
            | Op::WriteGuest { offset, .. }
            | Op::Discard { offset, .. }
            | Op::WriteZeroes { offset, .. } => *offset,
            Op::Fsync | Op::Fdatasync => 0,
        }
    }

    /// Total bytes the request transfers between memory and the file (0 for syncs, discards
    /// and write-zeroes, which move no data; see [`Op::range_len`]).
    pub fn len(&self) -> usize {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => buf.len(),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs.iter().map(|b| b.len()).sum(),
            Op::ReadGuest { mem, .. } | Op::WriteGuest { mem, .. } => mem.len(),
            Op::Fsync | Op::Fdatasync | Op::Discard { .. } | Op::WriteZeroes { .. } => 0,
        }
    }

    /// Whether the request transfers no bytes (syncs and range ops; data ops are refused when
    /// empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of the file the op covers: its transfer length, or a range op's `len`.
    pub fn range_len(&self) -> u64 {
        match self {
            Op::Discard { len, .. } | Op::WriteZeroes { len, .. } => *len,
            _ => self.len() as u64,
        }
    }

    /// Moves the memory out, leaving the op without it.
    pub fn into_buffers(self) -> IoBuffers {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => IoBuffers::One(buf),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => IoBuffers::Many(bufs),
            Op::ReadGuest { mem, .. } | Op::WriteGuest { mem, .. } => IoBuffers::Guest(mem),
            Op::Fsync | Op::Fdatasync | Op::Discard { .. } | Op::WriteZeroes { .. } => {
                IoBuffers::None
            }
        }
    }

    /// The owned buffers, mutably, in transfer order (empty for guest memory and ops without
    /// data; see [`Op::segments`]).
    pub fn buffers_mut(&mut self) -> &mut [AlignedBuf] {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => std::slice::from_mut(buf),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs,
            _ => &mut [],
        }
    }

    /// Every segment of memory the op transfers, as `(address, length)` in transfer order.
    ///
    /// Takes `&mut self` because the addresses are for the kernel to write through: they stay
    /// valid while the op is neither moved out of nor dropped.
    pub fn segments(&mut self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        let (owned, guest): (&mut [AlignedBuf], &[libc::iovec]) = match self {
            Op::ReadGuest { mem, .. } | Op::WriteGuest { mem, .. } => (&mut [], mem.as_iovecs()),
            other => (other.buffers_mut(), &[]),
        };
        owned
            .iter_mut()
            .map(|b| (b.as_mut_ptr(), b.len()))
            .chain(guest.iter().map(|v| (v.iov_base.cast::<u8>(), v.iov_len)))
    }
}

/// One block I/O request: a file, an op, per-request flags, and a caller-chosen token echoed
/// in its completion.
///
/// `Request` is `Send` (an engine may run it on a worker thread): its buffers are owned, and
/// lent memory is a [`LentMemory`] whose constructor promised exclusive use.
#[derive(Debug)]
pub struct Request {
    /// The file.
    pub file: IoFile,
    /// What to do.
    pub op: Op,
    /// The caller's id for this request, returned in its [`Completion`].
    pub token: u64,
    /// Per-request flags ([`RwFlags::FUA`], [`RwFlags::NOWAIT`]); reads and writes only.
    pub flags: RwFlags,
}

impl Request {
    /// A request for `op` on `file`, without flags.
    pub fn new(file: &IoFile, op: Op, token: u64) -> Self {
        Request {
            file: file.clone(),
            op,
            token,
            flags: RwFlags::NONE,
        }
    }

    /// A read of `buf.len()` bytes at `offset`.
    pub fn read(file: &IoFile, offset: u64, buf: AlignedBuf, token: u64) -> Self {
        Self::new(file, Op::Read { offset, buf }, token)
    }

    /// A write of `buf` at `offset`.
    pub fn write(file: &IoFile, offset: u64, buf: AlignedBuf, token: u64) -> Self {
        Self::new(file, Op::Write { offset, buf }, token)
    }

    /// A vectored read at `offset`.
    pub fn readv(file: &IoFile, offset: u64, bufs: Vec<AlignedBuf>, token: u64) -> Self {
        Self::new(file, Op::Readv { offset, bufs }, token)
    }

    /// A vectored write at `offset`.
    pub fn writev(file: &IoFile, offset: u64, bufs: Vec<AlignedBuf>, token: u64) -> Self {
        Self::new(file, Op::Writev { offset, bufs }, token)
    }

    /// A read at `offset` straight into memory the caller lends (see [`LentMemory`]).
    pub fn read_guest(file: &IoFile, offset: u64, mem: LentMemory, token: u64) -> Self {
        Self::new(file, Op::ReadGuest { offset, mem }, token)
    }

    /// A write at `offset` straight from memory the caller lends (see [`LentMemory`]).
    pub fn write_guest(file: &IoFile, offset: u64, mem: LentMemory, token: u64) -> Self {
        Self::new(file, Op::WriteGuest { offset, mem }, token)
    }

    /// `fsync(2)` of the file.
    pub fn fsync(file: &IoFile, token: u64) -> Self {
        Self::new(file, Op::Fsync, token)
    }

    /// `fdatasync(2)` of the file.
    pub fn fdatasync(file: &IoFile, token: u64) -> Self {
        Self::new(file, Op::Fdatasync, token)
    }

    /// A discard of `len` bytes at `offset` (see [`Op::Discard`]).
    pub fn discard(file: &IoFile, offset: u64, len: u64, token: u64) -> Self {
        Self::new(file, Op::Discard { offset, len }, token)
    }

    /// A write-zeroes of `len` bytes at `offset`, freeing the blocks with `unmap` (see
    /// [`Op::WriteZeroes`]).
    pub fn write_zeroes(file: &IoFile, offset: u64, len: u64, unmap: bool, token: u64) -> Self {
        Self::new(file, Op::WriteZeroes { offset, len, unmap }, token)
    }

    /// The same request with `flags` ([`RwFlags::FUA`] for a write that is durable when it
    /// completes).
    pub fn with_flags(mut self, flags: RwFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Checks what can be checked without the kernel: non-empty data and range ops, at most
    /// `IOV_MAX` segments, offsets and lengths that fit the kernel's signed 64-bit `loff_t`,
    /// flags that fit the op, and on a file opened with `O_DIRECT` the alignment of offsets,
    /// lengths and addresses ([`IoFile::direct_io_alignment`]).
    pub fn validate(&self) -> Result<(), RequestError> {
        let op = &self.op;
        let name = op.name();
        if !self.flags.is_empty() {
            let bad = if self.flags.contains(RwFlags::FUA) {
                !op.is_write()
            } else {
                !op.is_data()
            };
            if bad {
                return Err(RequestError::FlagsNotForOp {
                    op: name,
                    flags: self.flags,
                });
            }
        }
        if matches!(op, Op::Fsync | Op::Fdatasync) {
            return Ok(());
        }
        let segments = match op {
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs.len(),
            Op::ReadGuest { mem, .. } | Op::WriteGuest { mem, .. } => mem.count(),
            _ => 1,
        };
        if segments > IOV_MAX {
            return Err(RequestError::TooManyBuffers { count: segments });
        }
        let len = op.range_len();
        if len == 0 {
            return Err(RequestError::ZeroLength { op: name });
        }
        let offset = op.offset();
        // `len` is at least 1, so an offset past `i64::MAX` has its end past it too.
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > i64::MAX as u64) {
            return Err(RequestError::OffsetOutOfRange { offset, len });
        }
        if let (Some(align), true) = (self.file.direct_io_alignment(), op.is_data()) {
            let misaligned = |what, value| RequestError::Misaligned {
                op: name,
                what,
                value,
                align,
            };
            if offset % align.offset as u64 != 0 {
                return Err(misaligned("file offset", offset));
            }
            let first_bad = match op {
                Op::ReadGuest { mem, .. } | Op::WriteGuest { mem, .. } => mem.misaligned(align),
                _ => {
                    let bufs: &[AlignedBuf] = match op {
                        Op::Read { buf, .. } | Op::Write { buf, .. } => std::slice::from_ref(buf),
                        Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs,
                        _ => &[],
                    };
                    bufs.iter().enumerate().find_map(|(i, b)| {
                        let base = b.as_ptr() as usize;
                        (base % align.memory != 0 || b.len() % align.offset != 0).then_some((
                            i,
                            base,
                            b.len(),
                        ))
                    })
                }
            };
            if let Some((_, base, seg_len)) = first_bad {
                return Err(if base % align.memory != 0 {
                    misaligned("buffer address", base as u64)
                } else {
                    misaligned("segment length", seg_len as u64)
                });
            }
        }
        Ok(())
    }

    /// Completes this request without running it: the memory goes back with `result`.
    pub fn complete(self, result: std::io::Result<usize>) -> Completion {
        Completion {
            token: self.token,
            result,
            buf: self.op.into_buffers(),
        }
    }
}

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
    use std::io;
    use std::os::unix::fs::OpenOptionsExt;

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
        assert!(matches!(
            Request::discard(&f, 0, 0, 1).validate(),
            Err(RequestError::ZeroLength { op: "discard" })
        ));
        assert!(matches!(
            Request::write_zeroes(&f, i64::MAX as u64, 2, false, 1).validate(),
            Err(RequestError::OffsetOutOfRange { .. })
        ));
        assert!(Request::discard(&f, 0, 1 << 40, 1).validate().is_ok());
        let e: io::Error = RequestError::ZeroLength { op: "read" }.into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn flags_fit_the_op() {
        let f = file();
        let fua_write = Request::write(&f, 0, AlignedBuf::new(512), 1).with_flags(RwFlags::FUA);
        assert!(fua_write.validate().is_ok());
        let fua_read = Request::read(&f, 0, AlignedBuf::new(512), 1).with_flags(RwFlags::FUA);
        assert!(matches!(
            fua_read.validate(),
            Err(RequestError::FlagsNotForOp { op: "read", .. })
        ));
        let nowait = Request::read(&f, 0, AlignedBuf::new(512), 1).with_flags(RwFlags::NOWAIT);
        assert!(nowait.validate().is_ok());
        let sync = Request::fsync(&f, 1).with_flags(RwFlags::NOWAIT);
        assert!(sync.validate().is_err());
        let both = RwFlags::FUA | RwFlags::NOWAIT;
        assert!(both.contains(RwFlags::FUA) && both.contains(RwFlags::NOWAIT));
        assert_eq!(format!("{both:?}"), "RwFlags(FUA | NOWAIT)");
    }

    #[test]
    fn direct_io_alignment_is_checked_up_front() {
        let path = std::env::temp_dir().join(format!("aio-core-align-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 65536]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("O_DIRECT in the temp dir");
        std::fs::remove_file(&path).unwrap();
        let f = IoFile::from(f);
        let align = f.direct_io_alignment().unwrap();
        let ok = Request::read(&f, 0, AlignedBuf::new(4096), 1);
        assert!(ok.validate().is_ok());
        let bad_offset = Request::read(&f, 1, AlignedBuf::new(4096), 1);
        assert!(matches!(
            bad_offset.validate(),
            Err(RequestError::Misaligned {
                what: "file offset",
                ..
            })
        ));
        let bad_len = Request::read(&f, 0, AlignedBuf::new(align.offset + 1), 1);
        assert!(matches!(
            bad_len.validate(),
            Err(RequestError::Misaligned {
                what: "segment length",
                ..
            })
        ));
        let mut mem = AlignedBuf::new(8192);
        let base = mem.as_mut_ptr().wrapping_add(1);
        // SAFETY: the segment lies inside `mem`, which outlives the request; never submitted.
        let guest = unsafe { LentMemory::new([(base, 4096)], None) };
        let bad_base = Request::read_guest(&f, 0, guest, 1);
        let err = bad_base.validate().unwrap_err();
        assert!(matches!(
            err,
            RequestError::Misaligned {
                what: "buffer address",
                ..
            }
        ));
        assert_eq!(io::Error::from(err).kind(), io::ErrorKind::InvalidInput);
        // Range ops are not data transfers: no memory, no alignment.
        assert!(Request::discard(&f, 1, 1, 1).validate().is_ok());
    }
}
