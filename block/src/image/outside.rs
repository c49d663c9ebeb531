//! I/O outside a request: an image read and written on the calling thread, blocking, by a
//! block job that runs on a thread of its own (a backup's copies), never by an export.
//!
//! This module owns the checks such I/O passes (inside the image, a writable and active
//! image for a change) and the request filter's part in it; each kind's blocking I/O is its
//! driver's (`read_blocking` and the rest).
//!
//! * **A change is a write like any other.** It goes through the request filter first (the
//!   image's own copy-before-write and durable bitmaps) and dirties the image's recording
//!   bitmaps when it ends, failed or not, as a request from a queue does.
//! * **Never on a queue's thread.** Each call blocks for the syscalls it makes (a qcow2
//!   image's metadata reads and write-back included): an iothread that called it would stall
//!   every request it serves.
//! * **Memory aligned for `O_DIRECT`.** Buffers are the caller's; an image opened with
//!   `O_DIRECT` needs them aligned as its file asks ([`AlignedBuf`] is), and offsets and
//!   lengths in whole sectors.
//!
//! [`AlignedBuf`]: aio_core::engine::AlignedBuf

use std::io;
use std::sync::Arc;

use super::driver::Driver;
use super::hooks::{BackingNode, CopyHook, KindId};
use super::{dispatch, Image};
use crate::request;
use crate::status::Extent;

impl Image {
    /// Fills `buf` from `offset`, blocking (see the module's contract). An inactive image
    /// is read too, as its requests are.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_outside(offset, buf.len() as u64, false)?;
        dispatch!(self.backing(), d => d.read_blocking(offset, buf))
    }

    /// Writes `buf` at `offset`, blocking, through the request filter.
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let len = buf.len() as u64;
        self.check_outside(offset, len, true)?;
        crate::filter::before_submit(self, (offset, len))?;
        let result = dispatch!(self.backing(), d => d.write_blocking(offset, buf));
        self.dirty_bitmaps().mark(offset, len);
        result
    }

    /// Makes `[offset, offset + len)` read as zeros, blocking, through the request filter.
    pub fn write_zeroes_at(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_outside(offset, len, true)?;
        crate::filter::before_submit(self, (offset, len))?;
        let result = dispatch!(self.backing(), d => d.write_zeroes_blocking(offset, len));
        self.dirty_bitmaps().mark(offset, len);
        result
    }

    /// Writes back what the image caches and syncs its files, blocking.
    pub fn flush_blocking(&self) -> io::Result<()> {
        if self.is_read_only() || !self.is_active() {
            return Ok(());
        }
        dispatch!(self.backing(), d => d.flush_blocking())
    }

    /// The checks a request from a queue passes, for I/O outside one.
    fn check_outside(&self, offset: u64, len: u64, modifies: bool) -> io::Result<()> {
        let fits = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.size());
        if !fits {
            return Err(request::invalid());
        }
        if modifies && self.is_read_only() {
            return Err(request::read_only());
        }
        if modifies && !self.is_active() {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(())
    }
}

/// What an image lends the images over it (`qcow2/node_backing.rs`).
impl BackingNode for Image {
    fn node_size(&self) -> u64 {
        self.size()
    }

    fn read_node(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_at(offset, buf)
    }

    fn node_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.block_status(offset, len)
    }

    fn copy_to(&self, reader: KindId) -> Option<Arc<dyn CopyHook>> {
        self.copy_hooks().copy_to(reader)
    }
}
