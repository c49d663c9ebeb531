//! `GuestIovecs`: requests that read into and write from memory the caller owns, with no copy.
//!
//! This module owns the one promise the compiler cannot check for such requests, made once in
//! [`GuestIovecs::new`], and the alignment check against a file opened with `O_DIRECT`. It
//! never allocates, frees or touches the memory itself.

use std::fmt;

use super::file::DirectIoAlignment;

/// Segments of memory the caller owns (a VMM's guest RAM, an mmap'd region, a pool of its
/// own), as `(address, length)` pairs, for a read straight into them or a write straight
/// from them: [`Request::read_guest`](super::Request::read_guest) and
/// [`Request::write_guest`](super::Request::write_guest).
///
/// The safe, owned default for request memory is [`AlignedBuf`](super::AlignedBuf); this type
/// is for memory whose owner is not the engine and must not be copied.
///
/// # What drop does
///
/// Dropping a `GuestIovecs` releases nothing (the memory is the caller's). An engine holds the
/// value while the kernel or a worker may touch the memory and hands it back in the request's
/// [`Completion`](super::Completion), so the promise of [`GuestIovecs::new`] ends when the
/// completion is returned. If the engine is dropped first (or the `AioContext` it is
/// attached to, which drops it), the drop waits until the kernel and the workers are done with
/// every request, and requests still queued are never started. An engine that cannot learn
/// whether the kernel is done (its wait fails, which a working kernel never does) aborts the
/// process rather than return while the kernel may still write caller memory.
///
pub struct GuestIovecs {
    iovecs: Vec<libc::iovec>,
    len: usize,
}

// SAFETY: the constructor's contract gives the value exclusive use of the memory for as long
// as it lives, wherever it is moved (an engine moves it to its worker threads or leaves it in
// its in-flight table); it is a claim on memory, like an owned buffer.
unsafe impl Send for GuestIovecs {}
// SAFETY: a shared reference exposes only the addresses and lengths, never the memory.
unsafe impl Sync for GuestIovecs {}

impl GuestIovecs {
    /// Segments `(address, length)`, in transfer order.
    ///
    /// # Safety
    ///
    /// From this call until the value is dropped (after its request's completion has handed it
    /// back, or the engine holding it has been dropped):
    ///
    /// * every segment is valid for reads and writes of its length (mapped, not freed, not
    ///   unmapped);
    /// * nothing else writes the memory, and while a read is in flight into it nothing else
    ///   reads it either: the kernel or a worker thread may write it at any moment.
    pub unsafe fn new(segments: impl IntoIterator<Item = (*mut u8, usize)>) -> Self {
        let iovecs: Vec<libc::iovec> = segments
            .into_iter()
            .map(|(base, len)| libc::iovec {
                iov_base: base.cast(),
                iov_len: len,
            })
            .collect();
        let len = iovecs
            .iter()
            .fold(0usize, |sum, v| sum.saturating_add(v.iov_len));
        GuestIovecs { iovecs, len }
    }

    /// One segment: `len` bytes at `base`.
    ///
    /// # Safety
    ///
    /// As for [`GuestIovecs::new`].
    pub unsafe fn from_raw_parts(base: *mut u8, len: usize) -> Self {
        // SAFETY: the caller's promise is the one `new` asks for.
        unsafe { Self::new([(base, len)]) }
    }

    /// The segments, in transfer order (for handing to the kernel).
    pub fn as_iovecs(&self) -> &[libc::iovec] {
        &self.iovecs
    }

    /// How many segments.
    pub fn count(&self) -> usize {
        self.iovecs.len()
    }

    /// Total bytes (saturating at `usize::MAX`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first segment that breaks `align` (`offset` is the request's file offset), as
    /// `(segment index, address, length)`; the offset itself is checked by the caller.
    pub(crate) fn misaligned(&self, align: DirectIoAlignment) -> Option<(usize, usize, usize)> {
        self.iovecs.iter().enumerate().find_map(|(i, v)| {
            let (base, len) = (v.iov_base as usize, v.iov_len);
            (base % align.memory != 0 || len % align.offset != 0).then_some((i, base, len))
        })
    }
}

impl fmt::Debug for GuestIovecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuestIovecs")
            .field("segments", &self.iovecs.len())
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_alignment() {
        let mut mem = vec![0u8; 8192];
        let base = mem.as_mut_ptr();
        // SAFETY: both segments lie inside `mem`, which outlives `g` and is not used meanwhile.
        let g = unsafe { GuestIovecs::new([(base, 100), (base.wrapping_add(200), 300)]) };
        assert_eq!((g.count(), g.len()), (2, 400));
        let align = DirectIoAlignment {
            memory: 1,
            offset: 100,
        };
        assert_eq!(g.misaligned(align), None);
        let align = DirectIoAlignment {
            memory: 1,
            offset: 200,
        };
        assert_eq!(g.misaligned(align).map(|m| m.0), Some(0));
        drop(g);
        drop(mem);
    }
}
