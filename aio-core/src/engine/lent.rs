//! `LentMemory`: memory a caller lends to a request (a VMM's guest RAM, a socket's receive
//! buffer, a buffer of its own), read into and written from with no copy.
//!
//! This module owns the one type for such memory in every layer (engines, the block layer,
//! RBD, the virtio-blk and vhost-user-blk devices): its segments, the hold that keeps them
//! valid, the one promise the compiler cannot check ([`LentMemory::new`]), the owned forms
//! ([`LentMemory::from_vec`], [`LentMemory::from_aligned`] and the way back,
//! [`ReturnedBuf`]), copies into and out of the memory, and the alignment check against a file
//! opened with `O_DIRECT`. It never submits anything, and never frees or unmaps lent memory
//! itself: an owned buffer goes when the last clone of its hold does.

use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use super::buf::AlignedBuf;
use super::file::DirectIoAlignment;

/// What keeps lent memory valid: a memory table's mappings, an owned buffer. Cloned where one
/// lent memory becomes several requests (the block layer's qcow2 path submits parts of it),
/// so an `Arc`; dropped by the last request done with the memory.
pub type MemoryHold = Arc<dyn Any + Send + Sync>;

/// The segments of one request, inline up to four (a request usually has one or two): no
/// allocation per request.
type Segments = SmallVec<[libc::iovec; 4]>;

/// Memory a caller lends to a request: segments `(address, length)` in transfer order, their
/// total length, and optionally a [`MemoryHold`] that keeps them valid.
///
/// Engines take it through [`Request::read_guest`](super::Request::read_guest) and
/// [`Request::write_guest`](super::Request::write_guest) and hand it back in the request's
/// [`Completion`](super::Completion); the block layer's requests (`aio_block::BlockRequest`)
/// and librbd's (`aio_rbd::RbdQueue`) carry it the same way. The safe, owned default for an
/// engine's request memory is [`AlignedBuf`]; this type is for memory whose owner is not the
/// engine and must not be copied, or for an owned buffer lent so ([`from_vec`](Self::from_vec),
/// [`from_aligned`](Self::from_aligned)).
///
/// # What keeps the memory valid
///
/// Whoever holds the value holds the memory: an engine keeps it while the kernel or a worker
/// may touch the memory and hands it back in the completion; if the engine is dropped first
/// (or the `AioContext` it is attached to, which drops it), the drop waits until the kernel and
/// the workers are done with every request, and requests still queued are never started. An
/// engine that cannot learn whether the kernel is done (its wait fails, which a working kernel
/// never does) aborts the process rather than return while the kernel may still write lent
/// memory. Dropping the value releases nothing but its clone of the hold.
///
/// The hold is what lets memory outlive the value: code that lends parts of one lent memory on
/// as requests of their own (the block layer's qcow2 images) makes each part with a clone of
/// the hold, so the memory stays valid while any part is in flight, even if the request that
/// made them is dropped first. Memory lent without a hold cannot be split so; the block layer
/// copies it instead.
pub struct LentMemory {
    segments: Segments,
    len: usize,
    hold: Option<MemoryHold>,
}

// SAFETY: the value is a claim on memory that `LentMemory::new`'s caller made valid and
// unshared for as long as the value (and its hold) lives, wherever it is moved: an engine moves
// it to a worker thread, librbd's callback moves it back to the loop. Moving the claim moves
// no reference, and the hold is `Send + Sync` itself.
unsafe impl Send for LentMemory {}
// SAFETY: through a shared reference the memory is only read (`copy_out`) or its addresses
// given out; every write through the value (`copy_in`, `zero`) takes `&mut self`. While a
// request is in flight the engine owns the value, so no shared reference exists then, and at
// other times the promise lets whoever holds the claim read the memory.
unsafe impl Sync for LentMemory {}

impl LentMemory {
    /// Segments `(address, length)` of memory the caller lends, in transfer order, kept valid
    /// by `hold` if one is given.
    ///
    /// # Safety
    ///
    /// For every segment, from this call on:
    ///
    /// * **Valid.** The memory is valid for reads and writes of the segment's length (mapped,
    ///   not freed, not unmapped) until the value is dropped and, when `hold` is given, until
    ///   every clone of `hold` is dropped as well. A hold whose own drop is what frees or
    ///   unmaps the memory (a clone of a memory table's `Arc`, of an owned buffer's) keeps this
    ///   by itself.
    /// * **Unshared while lent.** Until the value comes back (an engine's completion hands it
    ///   back, the request that took it tells its end: `aio_block`'s `Reply::finish`, an
    ///   `RbdQueue` callback) or is dropped, nothing else in this process writes the memory,
    ///   and while a read is in flight into it nothing else reads it either: the kernel or a
    ///   worker thread may write it at any moment. (A VMM's guest racing on its own buffers,
    ///   as with any DMA, is the guest's business: no Rust reference is made into the memory.)
    pub unsafe fn new(
        segments: impl IntoIterator<Item = (*mut u8, usize)>,
        hold: Option<MemoryHold>,
    ) -> Self {
        let mut memory = Self::empty(hold);
        for (base, len) in segments {
            // SAFETY: the caller's promise for every segment, with this value's hold.
            unsafe { memory.push(base, len) };
        }
        memory
    }

    /// No segments yet, kept valid by `hold`: [`push`](Self::push) adds them (an export that
    /// translates its addresses one by one, and may find one it cannot, builds its memory so,
    /// with no list of its own in between).
    pub fn empty(hold: Option<MemoryHold>) -> Self {
        LentMemory {
            segments: Segments::new(),
            len: 0,
            hold,
        }
    }

    /// Adds the segment of `len` bytes at `base`, after the others.
    ///
    /// # Safety
    ///
    /// As for [`LentMemory::new`], for this segment and this value's hold.
    pub unsafe fn push(&mut self, base: *mut u8, len: usize) {
        self.segments.push(libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        });
        self.len = self.len.saturating_add(len);
    }

    /// An owned buffer lent as a request's memory; [`into_vec`](Self::into_vec) gives it back.
    pub fn from_vec(buf: Vec<u8>) -> Self {
        Owned::lend(buf, |v| (v.as_mut_ptr(), v.len())).0
    }

    /// The buffer of a [`from_vec`](Self::from_vec) memory, once nothing else holds it (no
    /// part of it is still in flight); the memory itself otherwise, or if it is no owned
    /// vector.
    pub fn into_vec(mut self) -> Result<Vec<u8>, Self> {
        let Some(hold) = self.hold.take() else {
            return Err(self);
        };
        match hold.downcast::<Owned<Vec<u8>>>().map(Arc::try_unwrap) {
            // Ours alone: no segment of this value is used again (it is dropped here).
            Ok(Ok(owned)) => Ok(owned.0.into_inner()),
            Ok(Err(shared)) => {
                self.hold = Some(shared);
                Err(self)
            }
            Err(other) => {
                self.hold = Some(other);
                Err(self)
            }
        }
    }

    /// An owned aligned buffer lent as a request's memory (a test's, an example's, a
    /// protocol's receive buffer), and the handle that gives it back once every request has
    /// let it go: for a memory that does not come back itself (an `aio_block` request's
    /// memory ends with the request).
    pub fn from_aligned(buf: AlignedBuf) -> (Self, ReturnedBuf) {
        let (memory, cell) = Owned::lend(buf, |b| (b.as_mut_ptr(), b.len()));
        (memory, ReturnedBuf(cell))
    }

    /// The segments, in transfer order (for handing to the kernel).
    pub fn as_iovecs(&self) -> &[libc::iovec] {
        &self.segments
    }

    /// How many segments.
    pub fn count(&self) -> usize {
        self.segments.len()
    }

    /// Total bytes (saturating at `usize::MAX`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What keeps the memory valid, if the lender gave a hold: a clone of it lends parts of
    /// the memory on (see [`LentMemory::new`]'s promise).
    pub fn hold(&self) -> Option<&MemoryHold> {
        self.hold.as_ref()
    }

    /// Copies the first `dst.len()` bytes (at most) of the memory into `dst`, in order;
    /// returns how many.
    pub fn copy_out(&self, dst: &mut [u8]) -> usize {
        let mut at = 0;
        for v in &self.segments {
            if at == dst.len() {
                break;
            }
            let n = v.iov_len.min(dst.len() - at);
            // SAFETY: `new`'s promise: the segment is valid for reads of its length and
            // nothing in this process writes it while the value lives; `dst` is ours, apart
            // from it (a `&mut` cannot point into memory no Rust reference is made to).
            unsafe {
                std::ptr::copy_nonoverlapping(v.iov_base.cast::<u8>(), dst[at..].as_mut_ptr(), n)
            };
            at += n;
        }
        at
    }

    /// Copies `src` into the memory, in order (as much of it as fits); returns how many bytes.
    pub fn copy_in(&mut self, src: &[u8]) -> usize {
        let mut at = 0;
        for v in &self.segments {
            if at == src.len() {
                break;
            }
            let n = v.iov_len.min(src.len() - at);
            // SAFETY: `new`'s promise: the segment is valid for writes and nothing else uses
            // it; `&mut self` keeps this the only access through the value, and `src` cannot
            // point into memory no Rust reference is made to.
            unsafe {
                std::ptr::copy_nonoverlapping(src[at..].as_ptr(), v.iov_base.cast::<u8>(), n)
            };
            at += n;
        }
        at
    }

    /// Fills the memory with zeros.
    ///
    /// Copied from a page of zeros rather than set (`memset`): for a page or more glibc sets
    /// with `rep stosb`, and the reader on another CPU then waited longer for the lines (the
    /// null image's reads at QD 32: 1.10 -> 1.18 M IOPS with the copy, measured).
    pub fn zero(&mut self) {
        static ZEROS: [u8; 4096] = [0; 4096];
        for v in &self.segments {
            let mut done = 0;
            while done < v.iov_len {
                let n = (v.iov_len - done).min(ZEROS.len());
                // SAFETY: as in `copy_in`: valid for writes, used by nothing else, and
                // `&mut self` keeps this the only access through the value.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        ZEROS.as_ptr(),
                        v.iov_base.cast::<u8>().add(done),
                        n,
                    )
                };
                done += n;
            }
        }
    }

    /// The first segment that breaks `align` (`offset` is the request's file offset), as
    /// `(segment index, address, length)`; the offset itself is checked by the caller.
    pub(crate) fn misaligned(&self, align: DirectIoAlignment) -> Option<(usize, usize, usize)> {
        self.segments.iter().enumerate().find_map(|(i, v)| {
            let (base, len) = (v.iov_base as usize, v.iov_len);
            (base % align.memory != 0 || len % align.offset != 0).then_some((i, base, len))
        })
    }
}

impl fmt::Debug for LentMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentMemory")
            .field("segments", &self.segments.len())
            .field("len", &self.len)
            .field("held", &self.hold.is_some())
            .finish()
    }
}

/// An owned buffer lent by [`LentMemory::from_vec`] or [`LentMemory::from_aligned`], the hold
/// of its memory. Private, so no one downcasts a hold to it: the buffer is reached only through
/// the memory's segments while a hold lives, and taken back whole once none does.
struct Owned<B>(UnsafeCell<B>);

// SAFETY: the buffer is owned (`B: Send`), and reached only as lent memory, under
// `LentMemory::new`'s promise, or by the one who unwrapped the last `Arc` of the cell.
unsafe impl<B: Send> Send for Owned<B> {}
// SAFETY: a shared reference to the cell never reads or writes the buffer.
unsafe impl<B: Send> Sync for Owned<B> {}

impl<B: Send + 'static> Owned<B> {
    /// `buf` in a cell of its own, lent as the one segment `segment` says, held by the cell.
    fn lend(buf: B, segment: impl FnOnce(&mut B) -> (*mut u8, usize)) -> (LentMemory, Arc<Self>) {
        let cell = Arc::new(Owned(UnsafeCell::new(buf)));
        // SAFETY: the cell is fresh and not shared yet: this is the only reference to it.
        let (base, len) = segment(unsafe { &mut *cell.0.get() });
        let hold: MemoryHold = cell.clone();
        // SAFETY: the buffer's heap memory stays where it is while the buffer sits in the cell,
        // and the cell lives until the last clone of the hold (or the handle back) is dropped;
        // nothing else reaches the buffer: the cell is private, and the ways back
        // (`into_vec`, `ReturnedBuf::take`) take it only once no other clone exists.
        let memory = unsafe { LentMemory::new([(base, len)], Some(hold)) };
        (memory, cell)
    }
}

/// The way back to a buffer lent with [`LentMemory::from_aligned`]: [`take`](Self::take) it
/// once every request has let it go.
pub struct ReturnedBuf(Arc<Owned<AlignedBuf>>);

impl fmt::Debug for ReturnedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnedBuf").finish_non_exhaustive()
    }
}

impl ReturnedBuf {
    /// The buffer, if nothing holds it any more (its memory has come back from every request
    /// and been dropped); the handle back otherwise.
    pub fn take(self) -> Result<AlignedBuf, Self> {
        Arc::try_unwrap(self.0)
            .map(|cell| cell.0.into_inner())
            .map_err(ReturnedBuf)
    }
}

/// The old name of [`LentMemory`], for one release. Its constructor is now
/// [`LentMemory::new`] with a hold (`None` for none), and `from_raw_parts(p, n)` is
/// `new([(p, n)], None)`.
#[deprecated(since = "0.2.0", note = "renamed `LentMemory`")]
pub type GuestIovecs = LentMemory;

#[cfg(test)]
#[path = "lent_tests.rs"]
mod tests;
