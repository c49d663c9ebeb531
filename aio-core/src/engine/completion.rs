//! Completions and refusals: what comes back from an engine.
//!
//! This module owns [`Completion`] (a request's result with its memory handed back),
//! [`IoBuffers`], and the typed reasons a request is refused before it runs
//! ([`RequestError`]); the refusal that hands the request back, `SubmitError`, is
//! `request.rs`'s (it holds a request). It performs no I/O.

use std::io;

use super::buf::AlignedBuf;
use super::file::DirectIoAlignment;
use super::flags::RwFlags;
use super::lent::LentMemory;

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
    /// A read or write of lent memory, handed back (with its hold) so that the caller knows
    /// the engine is done with that memory.
    Guest(LentMemory),
}

impl IoBuffers {
    /// The single buffer of a read or write.
    pub fn into_one(self) -> Option<AlignedBuf> {
        match self {
            IoBuffers::One(b) => Some(b),
            _ => None,
        }
    }

    /// All owned buffers, in order (empty for a sync and for guest memory).
    pub fn into_vec(self) -> Vec<AlignedBuf> {
        match self {
            IoBuffers::None | IoBuffers::Guest(_) => Vec::new(),
            IoBuffers::One(b) => vec![b],
            IoBuffers::Many(v) => v,
        }
    }

    /// The first (for a read or write, the only) buffer.
    pub fn first(&self) -> Option<&AlignedBuf> {
        match self {
            IoBuffers::None | IoBuffers::Guest(_) => None,
            IoBuffers::One(b) => Some(b),
            IoBuffers::Many(v) => v.first(),
        }
    }

    /// How many buffers (or guest segments) there are.
    pub fn count(&self) -> usize {
        match self {
            IoBuffers::None => 0,
            IoBuffers::One(_) => 1,
            IoBuffers::Many(v) => v.len(),
            IoBuffers::Guest(g) => g.count(),
        }
    }

    /// The memory of a read or write of lent memory.
    pub fn into_guest(self) -> Option<LentMemory> {
        match self {
            IoBuffers::Guest(g) => Some(g),
            _ => None,
        }
    }
}

/// The end of a request: its token, the bytes transferred (or the error, carrying the errno),
/// and its buffers back.
///
/// `Send + Sync`: plain data, the owned buffers and an `io::Error`.
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
        len: u64,
    },
    /// A data request on a file opened with `O_DIRECT` whose offset, segment length or
    /// buffer address breaks the file's direct-I/O alignment (the kernel would refuse it with
    /// `EINVAL`).
    #[error(
        "{op}: {what} {value} is not aligned for O_DIRECT on this file (addresses to {}, \
         offsets and lengths to {} bytes)",
        align.memory,
        align.offset
    )]
    Misaligned {
        /// The op's name.
        op: &'static str,
        /// `"file offset"`, `"segment length"` or `"buffer address"`.
        what: &'static str,
        /// The offending value.
        value: u64,
        /// What the file needs.
        align: DirectIoAlignment,
    },
    /// Flags the op cannot take ([`RwFlags::FUA`] on anything but a write, any flag on a
    /// sync or a range op).
    #[error("{op} cannot take {flags:?}")]
    FlagsNotForOp {
        /// The op's name.
        op: &'static str,
        /// The flags given.
        flags: RwFlags,
    },
    /// A token with a bit reserved for the layer's own use: an attached engine's
    /// per-request completions (`aio-loop`'s `PER_REQUEST_TOKEN_BIT`, bit
    /// 62) or the pool's offloaded work (`aio_pool::WORK_TOKEN_BIT`, bit 63).
    #[error("token {token:#x} uses bit {bit}, which {reserved_for} reserves")]
    ReservedToken {
        /// The token.
        token: u64,
        /// The reserved bit's number.
        bit: u32,
        /// What reserves it.
        reserved_for: &'static str,
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

crate::__io_error_from!(RequestError, |e| match e {
    RequestError::ShutDown { .. } => io::ErrorKind::BrokenPipe,
    RequestError::Unsupported { .. } => io::ErrorKind::Unsupported,
    _ => io::ErrorKind::InvalidInput,
});
