//! One request's trip through librbd: its completion, the memory librbd holds, and where its
//! end is delivered.
//!
//! This module owns submitting an [`RbdOp`] (`rbd_aio_*` with a completion whose callback
//! frees what the request held) and the callback itself; where the end goes is the
//! destination's ([`Deliver`]: a queue's mailbox, a future's slot). It never runs a caller's
//! code on librbd's thread.

use std::ffi::c_void;
use std::sync::Arc;

use aio_core::engine::LentMemory;

use crate::image::RbdImage;
use crate::sys;

/// A request librbd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RbdOp {
    /// Read the memory's length at this offset into the memory.
    Read(u64),
    /// Write the memory at this offset.
    Write(u64),
    /// Write back librbd's cache.
    Flush,
    /// Discard `(offset, length)`.
    Discard(u64, u64),
    /// Zero `len` bytes at `offset`; `unmap` lets the range be deallocated.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Whether the range may be deallocated (else `THICK_PROVISION`).
        unmap: bool,
    },
}

/// Where a request's end goes: called once, on librbd's thread (or the submitting one, for a
/// refusal), with the request's token, librbd's return value and its memory.
pub(crate) trait Deliver: Send + Sync {
    fn deliver(&self, token: u64, ret: i64, memory: Option<LentMemory>);
}

/// What librbd holds while a request runs: freed by the callback.
struct InFlight {
    to: Arc<dyn Deliver>,
    /// The image, kept open until this request's callback has ended ([`RbdImage::close`]
    /// waits for the count this request holds).
    image: *const RbdImage,
    token: u64,
    memory: Option<LentMemory>,
}

/// librbd's completion callback, on one of librbd's threads.
unsafe extern "C" fn request_done(c: sys::RbdCompletion, arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<InFlight>` leaked by `submit` for this completion, which
    // librbd calls back exactly once.
    let flight = unsafe { Box::from_raw(arg.cast::<InFlight>()) };
    let InFlight {
        to,
        image,
        token,
        memory,
    } = *flight;
    // SAFETY: the image stays open until this request's count is ended below (its close
    // waits for it, and its drop closes it), so the pointer is valid until then.
    let image = unsafe { &*image };
    // SAFETY: `c` is this request's completion, complete now, released just below.
    let ret = unsafe { (image.lib.rbd_aio_get_return_value)(c) };
    // SAFETY: `c` is released once, here; nothing uses it after.
    unsafe { (image.lib.rbd_aio_release)(c) };
    // librbd is done with the memory: it goes back with the result.
    to.deliver(token, ret as i64, memory);
    // The last use of the image: after this its close may proceed.
    image.end_request();
}

/// Hands `op` to librbd, its end to go to `to` with `token` (a refusal too, at once).
pub(crate) fn submit(
    image: &RbdImage,
    to: Arc<dyn Deliver>,
    token: u64,
    op: RbdOp,
    memory: Option<LentMemory>,
) {
    if !image.begin_request() {
        return to.deliver(token, -i64::from(libc::EBADF), memory);
    }
    let lib = image.lib;
    let flight = Box::into_raw(Box::new(InFlight {
        to,
        image,
        token,
        memory,
    }));
    // The iovec array is taken from the memory where it now stays, in the box: a
    // `LentMemory` keeps up to four segments inline, so the array moved with the value.
    // SAFETY: `flight` is the live box just made; nothing else reaches it until librbd's
    // callback, which runs only after the request below is submitted.
    let iov = unsafe { (*flight).memory.as_ref() }.map_or(&[][..], |m| m.as_iovecs());
    let (iov, iovcnt) = (iov.as_ptr(), iov.len() as i32);
    let mut c: sys::RbdCompletion = std::ptr::null_mut();
    // SAFETY: `flight` is a live box handed to librbd as the callback's argument; a live
    // out-pointer for the completion.
    let mut ret = unsafe { (lib.rbd_aio_create_completion)(flight.cast(), request_done, &mut c) };
    if ret >= 0 {
        let h = image.handle;
        // SAFETY: an open image (counted in flight, so not closed); the iovec array and the
        // memory it describes live in `flight`, which is not moved or freed until the callback
        // (the promise of `LentMemory::new`); `c` is fresh and given to exactly one request.
        ret = unsafe {
            match op {
                RbdOp::Read(offset) => (lib.rbd_aio_readv)(h, iov, iovcnt, offset, c),
                RbdOp::Write(offset) => (lib.rbd_aio_writev)(h, iov, iovcnt, offset, c),
                RbdOp::Flush => (lib.rbd_aio_flush)(h, c),
                RbdOp::Discard(offset, len) => (lib.rbd_aio_discard)(h, offset, len, c),
                RbdOp::WriteZeroes { offset, len, unmap } => {
                    let flags = if unmap { 0 } else { sys::WRITE_ZEROES_THICK };
                    (lib.rbd_aio_write_zeroes)(h, offset, len as usize, c, flags, 0)
                }
            }
        };
        if ret < 0 {
            // SAFETY: librbd refused the request, so it will never call `c` back: released
            // once, here.
            unsafe { (lib.rbd_aio_release)(c) };
        }
    }
    if ret < 0 {
        // SAFETY: the callback will never run (no completion, or it was refused), so the box
        // is still ours, taken back once.
        let flight = unsafe { Box::from_raw(flight) };
        let InFlight { to, memory, .. } = *flight;
        to.deliver(token, ret.into(), memory);
        image.end_request();
    }
}
