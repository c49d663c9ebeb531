//! Transmission requests, without I/O: a request header parsed, then checked against the
//! export it is for, into a [`Command`] to run or a refusal to answer.
//!
//! This module owns the header layouts (compact and extended) and every check a request
//! passes before the block layer sees it; it never touches a socket or an image.
//!
//! * A refusal carries the protocol's error (`EINVAL`, `ENOSPC`, `EPERM`, `EOVERFLOW`) and
//!   the payload bytes the connection must read and drop to stay in step with the client.
//! * A write whose payload is over the largest request cannot be skipped safely: it is
//!   answered, then the connection closes (as QEMU does).

use crate::export::NbdExport;
use crate::negotiate::ReplyStyle;
use crate::proto::{cmd, cmd_flag, err, Wire, MAX_PAYLOAD, REQUEST_EXT_MAGIC, REQUEST_MAGIC};

/// A request header as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// `NBD_CMD_*`.
    pub kind: u16,
    /// The client's cookie, given back in every reply to it.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Length (32 bits unless extended headers).
    pub length: u64,
}

/// A header whose magic is wrong: the connection is out of step and closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad request magic {0:#x}")]
pub struct BadMagic(pub u32);

/// The size of a request header in `style`.
pub fn header_len(style: ReplyStyle) -> usize {
    if style == ReplyStyle::Extended {
        32
    } else {
        28
    }
}

/// Parses a header of [`header_len`] bytes.
pub fn parse_header(bytes: &[u8], style: ReplyStyle) -> Result<Header, BadMagic> {
    let mut w = Wire::new(bytes);
    let mut field = || w.u64("field").unwrap_or_default();
    let first = field();
    let magic = (first >> 32) as u32;
    let extended = style == ReplyStyle::Extended;
    let expected = if extended {
        REQUEST_EXT_MAGIC
    } else {
        REQUEST_MAGIC
    };
    if magic != expected {
        return Err(BadMagic(magic));
    }
    let cookie = field();
    let offset = field();
    let length = if extended {
        field()
    } else {
        let mut w = Wire::new(bytes.get(24..).unwrap_or_default());
        u64::from(w.u32("length").unwrap_or_default())
    };
    Ok(Header {
        flags: (first >> 16) as u16,
        kind: first as u16,
        cookie,
        offset,
        length,
    })
}

/// A request that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes at `offset`; `df`: in one chunk.
    Read {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Write the `len`-byte payload at `offset`.
    Write {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// Force unit access.
        fua: bool,
    },
    /// Flush.
    Flush,
    /// Discard.
    Trim {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Flush after.
        fua: bool,
    },
    /// Write zeroes.
    WriteZeroes {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// May the range be deallocated (no `NBD_CMD_FLAG_NO_HOLE`).
        unmap: bool,
        /// Refuse rather than be slow (`NBD_CMD_FLAG_FAST_ZERO`).
        fast: bool,
        /// Flush after.
        fua: bool,
    },
    /// Prefetch (advisory).
    Cache,
    /// Block status of the negotiated contexts.
    BlockStatus {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// One extent only.
        req_one: bool,
    },
    /// Disconnect once every request in flight is answered.
    Disc,
}

/// A request answered with an error without running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The protocol's error.
    pub errno: u32,
    /// Why, for a structured error reply.
    pub message: String,
    /// Payload bytes to read and drop before the next header.
    pub skip: u64,
    /// The connection closes after the answer.
    pub fatal: bool,
}

/// What the connection does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Run it (a write's payload follows its header).
    Run(Command),
    /// Answer it with an error.
    Refuse(Refusal),
}

/// Checks `h` against `export`; `style` is the connection's, `block_status`: a metadata
/// context was negotiated for this export.
pub fn check(h: &Header, style: ReplyStyle, export: &NbdExport, block_status: bool) -> Checked {
    let extended = style == ReplyStyle::Extended;
    let payload_flag = extended && h.flags & cmd_flag::PAYLOAD_LEN != 0;
    let payload = match h.kind {
        cmd::WRITE => h.length,
        _ if payload_flag => h.length,
        _ => 0,
    };
    let refuse = |(errno, message): (u32, String)| {
        let fatal = payload > u64::from(MAX_PAYLOAD);
        Checked::Refuse(Refusal {
            errno,
            message,
            skip: if fatal { 0 } else { payload },
            fatal,
        })
    };
    if h.kind == cmd::DISC {
        return Checked::Run(Command::Disc);
    }
    match refusal(h, style, export).or_else(|| unready(h, block_status)) {
        Some(why) => refuse(why),
        None => Checked::Run(command_of(h)),
    }
}

/// Why `h` is refused by its kind, flags, range and alignment (None: it passes).
fn refusal(h: &Header, style: ReplyStyle, export: &NbdExport) -> Option<(u32, String)> {
    let (mut valid, data, modifies) = match h.kind {
        cmd::READ => (cmd_flag::FUA | cmd_flag::DF, true, false),
        cmd::WRITE => (cmd_flag::FUA | cmd_flag::PAYLOAD_LEN, true, true),
        cmd::FLUSH => (0, false, false),
        cmd::TRIM => (cmd_flag::FUA, false, true),
        cmd::CACHE => (0, true, false),
        cmd::WRITE_ZEROES => (
            cmd_flag::FUA | cmd_flag::NO_HOLE | cmd_flag::FAST_ZERO,
            false,
            true,
        ),
        cmd::BLOCK_STATUS => (cmd_flag::REQ_ONE, false, false),
        other => return Some((err::EINVAL, format!("unknown command {other}"))),
    };
    if style == ReplyStyle::Simple {
        valid &= !cmd_flag::DF;
    }
    if style != ReplyStyle::Extended {
        valid &= !cmd_flag::PAYLOAD_LEN;
    }
    if data && h.length > u64::from(MAX_PAYLOAD) {
        let why = format!(
            "length {} over the largest request, {MAX_PAYLOAD}",
            h.length
        );
        return Some((err::EINVAL, why));
    }
    if modifies && !export.is_writable() {
        return Some((err::EPERM, "the export is read-only".into()));
    }
    if h.flags & !valid != 0 {
        return Some((err::EINVAL, format!("unsupported flags {:#x}", h.flags)));
    }
    let size = export.size();
    let fits = h.offset <= size && h.length <= size - h.offset;
    if h.kind != cmd::FLUSH && !fits {
        let errno = match h.kind {
            cmd::WRITE | cmd::WRITE_ZEROES => err::ENOSPC,
            _ => err::EINVAL,
        };
        let why = format!("{} bytes at {} past the end, {size}", h.length, h.offset);
        return Some((errno, why));
    }
    let block = export.min_block();
    let aligned = (h.offset | h.length) % u64::from(block) == 0;
    if h.kind != cmd::FLUSH && h.kind != cmd::BLOCK_STATUS && !aligned {
        return Some((err::EINVAL, format!("request not aligned to {block} bytes")));
    }
    None
}

/// Why a block status request cannot be answered (no context negotiated, no bytes).
fn unready(h: &Header, block_status: bool) -> Option<(u32, String)> {
    if h.kind != cmd::BLOCK_STATUS {
        return None;
    }
    if !block_status {
        let why = "no metadata context negotiated for block status";
        return Some((err::EINVAL, why.into()));
    }
    (h.length == 0).then(|| (err::EINVAL, "block status of no bytes".into()))
}

/// The command of a header that passed its checks.
fn command_of(h: &Header) -> Command {
    let fua = h.flags & cmd_flag::FUA != 0;
    let (offset, len) = (h.offset, h.length);
    match h.kind {
        cmd::READ => Command::Read {
            offset,
            len: len as u32,
        },
        cmd::WRITE => Command::Write {
            offset,
            len: len as u32,
            fua,
        },
        cmd::FLUSH => Command::Flush,
        cmd::TRIM => Command::Trim { offset, len, fua },
        cmd::CACHE => Command::Cache,
        cmd::WRITE_ZEROES => Command::WriteZeroes {
            offset,
            len,
            unmap: h.flags & cmd_flag::NO_HOLE == 0,
            fast: h.flags & cmd_flag::FAST_ZERO != 0,
            fua,
        },
        _ => Command::BlockStatus {
            offset,
            len,
            req_one: h.flags & cmd_flag::REQ_ONE != 0,
        },
    }
}
