//! The null image: nothing behind it (QEMU's `null-co` with `read-zeroes=on`).
//!
//! This module owns what the null image answers: a read fills its memory with zeros, a write,
//! flush, discard or write-zeroes succeeds and keeps nothing, a resize takes any size. Every
//! request ends at once, on the submitting call: the null image measures an export's own cost.

use std::io;
use std::rc::Rc;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;

use super::driver::{Driver, QueueIo};
use super::error::ResizeError;
use crate::request::{BlockRequest, Reply};
use crate::status::{self, Extent, ExtentKind};

/// Nothing.
#[derive(Debug)]
pub(crate) struct NullImage;

impl Driver for NullImage {
    fn format_name(&self) -> &'static str {
        "null"
    }

    /// All zeros and nothing stored, as QEMU's `null-co` with `read-zeroes=on` answers.
    fn block_status(&self, offset: u64, len: u64, _size: u64) -> io::Result<Vec<Extent>> {
        let mut out = Vec::new();
        status::push(&mut out, offset, len, ExtentKind::Hole);
        Ok(out)
    }

    fn read_blocking(&self, _offset: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.fill(0);
        Ok(())
    }

    fn write_blocking(&self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes_blocking(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    fn flush_blocking(&self) -> io::Result<()> {
        Ok(())
    }

    fn resize(&self, _bytes: u64, _old: u64) -> Result<(), ResizeError> {
        Ok(())
    }

    fn submit<L, E, R>(
        &self,
        _io: &QueueIo<L, E>,
        _ctx: &AioContext<L>,
        reply: &Rc<R>,
        request: BlockRequest,
        tag: R::Tag,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
        R: Reply,
    {
        if let BlockRequest::Read { mut buffers, .. } = request {
            buffers.zero();
        }
        reply.finish(tag, Ok(()));
    }
}
