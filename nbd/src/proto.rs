//! The NBD protocol's numbers, as the NBD project's `doc/proto.md` gives them, and the
//! big-endian reading every message needs.
//!
//! This module owns the wire constants and [`Wire`], a cursor that refuses to read past a
//! message's end; it never decides what a message means (that is `negotiate.rs`'s and
//! `request.rs`'s).

/// `NBDMAGIC`: the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation, and the magic of every option the client sends.
pub const OPTS_MAGIC: u64 = 0x4948_4156_454f_5054;
/// The magic of every option reply.
pub const REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// A compact (28-byte) request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// An extended (32-byte) request, once extended headers are negotiated.
pub const REQUEST_EXT_MAGIC: u32 = 0x21e4_1c71;
/// A simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// A structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// An extended reply chunk.
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

/// Handshake flag: fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: no 124 zero bytes after `NBD_OPT_EXPORT_NAME`'s reply.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags, sent with the export's size.
pub mod tflag {
    /// The flags are there.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// The export refuses writes.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is served.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is honoured.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_CMD_TRIM` is served.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` is served.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_CMD_FLAG_DF` is honoured (structured replies only).
    pub const SEND_DF: u16 = 1 << 7;
    /// Every connection sees every other's completed writes and flushes.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_CMD_CACHE` is served.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_CMD_FLAG_FAST_ZERO` is honoured.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Options (`NBD_OPT_*`).
pub mod opt {
    /// Old way to choose an export and end negotiation; no error can be told.
    pub const EXPORT_NAME: u32 = 1;
    /// End the session.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade the connection to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe an export and start transmission on it.
    pub const GO: u32 = 7;
    /// Structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Choose metadata contexts for `NBD_CMD_BLOCK_STATUS`.
    pub const SET_META_CONTEXT: u32 = 10;
    /// Extended (64-bit) headers.
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types (`NBD_REP_*`).
pub mod rep {
    /// Done.
    pub const ACK: u32 = 1;
    /// One export of a list.
    pub const SERVER: u32 = 2;
    /// One piece of information about an export.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    const ERR: u32 = 1 << 31;
    /// The option is unknown.
    pub const ERR_UNSUP: u32 = ERR | 1;
    /// The server's policy refuses it.
    pub const ERR_POLICY: u32 = ERR | 2;
    /// The option is malformed.
    pub const ERR_INVALID: u32 = ERR | 3;
    /// TLS must come first.
    pub const ERR_TLS_REQD: u32 = ERR | 5;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = ERR | 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = ERR | 7;
    /// The client must ask for the block sizes.
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR | 8;
    /// The option's payload is too big.
    pub const ERR_TOO_BIG: u32 = ERR | 9;
}

/// Information types of `NBD_REP_INFO`.
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// The export's name.
    pub const NAME: u16 = 1;
    /// The export's description.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands (`NBD_CMD_*`).
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write.
    pub const WRITE: u16 = 1;
    /// Disconnect, once every request in flight has been answered.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Discard.
    pub const TRIM: u16 = 4;
    /// Prefetch (advisory).
    pub const CACHE: u16 = 5;
    /// Write zeroes.
    pub const WRITE_ZEROES: u16 = 6;
    /// Block status of the negotiated metadata contexts.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags (`NBD_CMD_FLAG_*`).
pub mod cmd_flag {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// Write zeroes without punching a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Don't fragment a structured read.
    pub const DF: u16 = 1 << 2;
    /// One extent per context in a block status reply.
    pub const REQ_ONE: u16 = 1 << 3;
    /// Fail a write-zeroes that would be slow.
    pub const FAST_ZERO: u16 = 1 << 4;
    /// The length is the payload's (extended headers).
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

/// Structured reply chunk types (`NBD_REPLY_TYPE_*`).
pub mod chunk {
    /// No payload: the end.
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// A range that reads as zeros.
    pub const OFFSET_HOLE: u16 = 2;
    /// Extents of one context (32-bit lengths).
    pub const BLOCK_STATUS: u16 = 5;
    /// Extents of one context (64-bit lengths; extended headers).
    pub const BLOCK_STATUS_EXT: u16 = 6;
    /// An error.
    pub const ERROR: u16 = (1 << 15) | 1;
    /// The reply's last chunk.
    pub const FLAG_DONE: u16 = 1;
}

/// `base:allocation` extent flags.
pub mod state {
    /// Not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as zeros.
    pub const ZERO: u32 = 1 << 1;
    /// Dirty, in a `qemu:dirty-bitmap:NAME` context (QEMU's `NBD_STATE_DIRTY`).
    pub const DIRTY: u32 = 1 << 0;
}

/// The errors a reply may carry (`NBD_E*`).
pub mod err {
    /// Not permitted (a read-only export).
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid request.
    pub const EINVAL: u32 = 22;
    /// No space (a write past the end).
    pub const ENOSPC: u32 = 28;
    /// Too large.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported (a fast zero that would be slow).
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// The protocol's error for a system error, as QEMU maps them (anything else is `EINVAL`).
pub fn nbd_errno(e: &std::io::Error) -> u32 {
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EROFS) => err::EPERM,
        Some(libc::EIO) => err::EIO,
        Some(libc::ENOMEM) => err::ENOMEM,
        Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT) => err::ENOSPC,
        Some(libc::EOVERFLOW) => err::EOVERFLOW,
        Some(libc::ENOTSUP) => err::ENOTSUP,
        Some(libc::ESHUTDOWN) => err::ESHUTDOWN,
        _ => err::EINVAL,
    }
}

/// The largest read or write (QEMU's `NBD_MAX_BUFFER_SIZE`, 32 MiB).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// The longest string (export name, description, context) the protocol allows.
pub const MAX_STRING: usize = 4096;
/// The largest option payload read (QEMU's bound too).
pub const MAX_OPTION: u32 = MAX_PAYLOAD;

/// A message ended before a field it must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the message ends before its {0}")]
pub struct Truncated(pub &'static str);

/// A big-endian cursor over one message's bytes.
#[derive(Debug)]
pub struct Wire<'a> {
    bytes: &'a [u8],
}

impl<'a> Wire<'a> {
    /// A cursor at `bytes`' start.
    pub fn new(bytes: &'a [u8]) -> Self {
        Wire { bytes }
    }

    /// The next `n` bytes, named `what` in the error.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Truncated> {
        if n > self.bytes.len() {
            return Err(Truncated(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// The next big-endian `u16`.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, Truncated> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// The next big-endian `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, Truncated> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The next big-endian `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, Truncated> {
        let b = self.bytes(8, what)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
}
