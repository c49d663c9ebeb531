//! Transmission replies, without I/O: the bytes of simple replies and of structured and
//! extended reply chunks, appended to a buffer the connection writes.
//!
//! This module owns the reply layouts and which one a connection's [`ReplyStyle`] uses;
//! it never decides what a request's answer is.
//!
//! * Simple style: every reply is simple (a read's data follows it).
//! * Structured style: a read's data (or its hole, when it reads as zeros) and every error
//!   are chunks; other successes are simple replies, as QEMU sends them.
//! * Extended style: every reply is an extended chunk (the protocol forbids simple ones).

use crate::negotiate::ReplyStyle;
use crate::proto::{chunk, EXTENDED_REPLY_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC};

/// Which request a reply answers: its cookie and offset (an extended chunk carries both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answering {
    /// The request's cookie.
    pub cookie: u64,
    /// The request's offset.
    pub offset: u64,
}

/// Appends a simple reply.
pub fn simple(out: &mut Vec<u8>, to: Answering, errno: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&to.cookie.to_be_bytes());
}

/// Appends a chunk header with a `payload`-byte payload to follow.
pub fn chunk_header(
    out: &mut Vec<u8>,
    style: ReplyStyle,
    to: Answering,
    (kind, done): (u16, bool),
    payload: u64,
) {
    let flags = if done { chunk::FLAG_DONE } else { 0 };
    if style == ReplyStyle::Extended {
        out.extend_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&to.cookie.to_be_bytes());
        out.extend_from_slice(&to.offset.to_be_bytes());
        out.extend_from_slice(&payload.to_be_bytes());
    } else {
        out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&to.cookie.to_be_bytes());
        out.extend_from_slice(&(payload as u32).to_be_bytes());
    }
}

/// Appends the reply to a request that succeeded without data.
pub fn done(out: &mut Vec<u8>, style: ReplyStyle, to: Answering) {
    match style {
        ReplyStyle::Extended => chunk_header(out, style, to, (chunk::NONE, true), 0),
        _ => simple(out, to, 0),
    }
}

/// Appends an error reply (a structured one carries `message`).
pub fn error(out: &mut Vec<u8>, style: ReplyStyle, to: Answering, errno: u32, message: &str) {
    if style == ReplyStyle::Simple {
        return simple(out, to, errno);
    }
    error_chunk(out, style, to, (errno, message), true);
}

/// Appends an `NBD_REPLY_TYPE_ERROR` chunk (structured and extended styles), the reply's
/// last when `done`.
pub fn error_chunk(
    out: &mut Vec<u8>,
    style: ReplyStyle,
    to: Answering,
    (errno, message): (u32, &str),
    done: bool,
) {
    // The protocol's strings are at most 4096 bytes; a message is cut on a char boundary.
    let mut end = message.len().min(4096);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    chunk_header(
        out,
        style,
        to,
        (chunk::ERROR, done),
        6 + message.len() as u64,
    );
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
}

/// Appends what goes before a successful read's `len` bytes of data at `offset`: a simple
/// reply, or one `NBD_REPLY_TYPE_OFFSET_DATA` chunk that ends the reply.
pub fn read_data(out: &mut Vec<u8>, style: ReplyStyle, to: Answering, offset: u64, len: u64) {
    if style == ReplyStyle::Simple {
        return simple(out, to, 0);
    }
    chunk_header(out, style, to, (chunk::OFFSET_DATA, true), 8 + len);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Appends one `NBD_REPLY_TYPE_OFFSET_HOLE` chunk that ends the reply: `len` bytes at
/// `offset` read as zeros (structured and extended styles only).
pub fn read_hole(out: &mut Vec<u8>, style: ReplyStyle, to: Answering, offset: u64, len: u32) {
    chunk_header(out, style, to, (chunk::OFFSET_HOLE, true), 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Appends a block status chunk of context `id` with `extents` (length, flags), the reply's
/// last when `done`. The connection's style picks the 32- or 64-bit layout; with 32-bit
/// lengths an extent is at most 4 GiB - 4 KiB (the caller splits longer ones).
pub fn block_status(
    out: &mut Vec<u8>,
    style: ReplyStyle,
    to: Answering,
    (id, done): (u32, bool),
    extents: &[(u64, u32)],
) {
    let count = extents.len() as u64;
    if style == ReplyStyle::Extended {
        chunk_header(
            out,
            style,
            to,
            (chunk::BLOCK_STATUS_EXT, done),
            8 + 16 * count,
        );
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&(count as u32).to_be_bytes());
        for &(len, flags) in extents {
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&u64::from(flags).to_be_bytes());
        }
    } else {
        chunk_header(out, style, to, (chunk::BLOCK_STATUS, done), 4 + 8 * count);
        out.extend_from_slice(&id.to_be_bytes());
        for &(len, flags) in extents {
            out.extend_from_slice(&(len as u32).to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
        }
    }
}
