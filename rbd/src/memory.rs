//! The memory of a read or write while librbd holds it.
//!
//! This module owns [`Memory`]: the segments a request reads into or writes from and what keeps
//! them valid, handed to librbd with the request and back with its end. It never submits.

use std::any::Any;

use aio_core::engine::GuestIovecs;

/// The memory of a read or write: the segments librbd reads or fills, and what keeps them
/// valid (a guest-memory mapping's hold, an owned buffer), given back when the request ends.
pub struct Memory {
    iov: GuestIovecs,
    owner: Box<dyn Any + Send>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("len", &self.iov.len())
            .finish_non_exhaustive()
    }
}

impl Memory {
    /// Segments the caller vouched for (in [`GuestIovecs::new`]), kept valid by `owner` for
    /// as long as this value lives.
    pub fn new(iov: GuestIovecs, owner: Box<dyn Any + Send>) -> Self {
        Memory { iov, owner }
    }

    /// An owned buffer as a request's memory; [`into_vec`](Self::into_vec) gives it back.
    pub fn from_vec(mut buf: Vec<u8>) -> Self {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: the vector's heap memory does not move when the `Vec` value moves into
        // the box, lives as long as the box, and is reached by nothing else meanwhile.
        let iov = unsafe { GuestIovecs::new([(ptr, len)]) };
        Memory {
            iov,
            owner: Box::new(buf),
        }
    }

    /// The buffer of a [`from_vec`](Self::from_vec) memory (None for any other).
    pub fn into_vec(self) -> Option<Vec<u8>> {
        drop(self.iov);
        self.owner.downcast::<Vec<u8>>().ok().map(|b| *b)
    }

    /// The segments and their owner, apart.
    pub fn into_parts(self) -> (GuestIovecs, Box<dyn Any + Send>) {
        (self.iov, self.owner)
    }

    /// The segments, as librbd takes them.
    pub(crate) fn iovecs(&self) -> &[libc::iovec] {
        self.iov.as_iovecs()
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.iov.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.iov.len() == 0
    }
}
