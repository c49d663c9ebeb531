//! `AlignedBuf`: heap memory aligned for `O_DIRECT`.
//!
//! This module owns the allocation and nothing else. An engine takes an `AlignedBuf` by value
//! when a request is submitted and gives it back in the [`Completion`](super::Completion), so
//! safe code can never read, write, reuse or free a buffer the kernel or a worker may still
//! be writing.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The next [`AlignedBuf::id`]; 0 is never given.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(feature = "testing")]
thread_local! {
    /// Buffers allocated minus buffers freed on this thread (feature `testing`): what
    /// [`kit::live_buffers`](crate::kit::live_buffers) reads.
    pub(crate) static LIVE_ON_THREAD: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

/// The default alignment: a 4 KiB page, which satisfies `O_DIRECT` on every common device.
pub const DEFAULT_ALIGN: usize = 4096;

/// An error creating an [`AlignedBuf`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BufError {
    /// The alignment is not a power of two.
    #[error("alignment {0} is not a power of two")]
    BadAlignment(usize),
    /// The size overflows when rounded up to the alignment.
    #[error("a buffer of {len} bytes aligned to {align} does not fit in memory")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// Requested alignment.
        align: usize,
    },
}

/// A zero-initialised heap buffer whose address is a multiple of its alignment.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
    id: u64,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); moving it to another
// thread moves that ownership.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of the owned bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to [`DEFAULT_ALIGN`].
    pub fn new(len: usize) -> Self {
        Self::with_alignment(len, DEFAULT_ALIGN).expect("4096-aligned buffer")
    }

    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    pub fn with_alignment(len: usize, align: usize) -> Result<Self, BufError> {
        if !align.is_power_of_two() {
            return Err(BufError::BadAlignment(align));
        }
        // Allocate at least one byte so that the pointer is real and aligned even for len 0.
        let layout = Layout::from_size_align(len.max(1), align)
            .map_err(|_| BufError::TooLarge { len, align })?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        #[cfg(feature = "testing")]
        LIVE_ON_THREAD.with(|n| n.set(n.get() + 1));
        Ok(AlignedBuf {
            ptr,
            len,
            layout,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// A buffer holding a copy of `data`, aligned to [`DEFAULT_ALIGN`].
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::new(data.len());
        b.copy_from_slice(data);
        b
    }

    /// This allocation's identity: unique in the process for as long as it runs (a clone is a
    /// new allocation with a new id; moving the buffer, into a request and back out of its
    /// completion, keeps it). Engines that register buffers with the kernel (io_uring's fixed
    /// buffers) key the registration by it, never by address: a new allocation at a freed
    /// buffer's address has another id, so it is never mistaken for the pages registered then.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The alignment of the buffer's address.
    pub fn alignment(&self) -> usize {
        self.layout.align()
    }

    /// A raw pointer to the first byte (for handing to the kernel).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// A raw mutable pointer to the first byte (for handing to the kernel).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to an owned, initialised (zeroed) allocation of >= len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        #[cfg(feature = "testing")]
        LIVE_ON_THREAD.with(|n| n.set(n.get() - 1));
        // SAFETY: allocated in `with_alignment` with exactly `self.layout`.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        let mut b = Self::with_alignment(self.len, self.alignment()).expect("same layout");
        b.copy_from_slice(self);
        b
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.alignment())
            .finish()
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for align in [512, 4096, 65536] {
            let mut b = AlignedBuf::with_alignment(8192, align).unwrap();
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert!(b.iter().all(|&x| x == 0));
            b[8191] = 7;
            assert_eq!(b.clone()[8191], 7);
        }
        assert_eq!(AlignedBuf::new(0).len(), 0);
        assert_eq!(
            AlignedBuf::with_alignment(10, 3).unwrap_err(),
            BufError::BadAlignment(3)
        );
        assert!(AlignedBuf::with_alignment(usize::MAX - 10, 4096).is_err());
        assert_eq!(&*AlignedBuf::from_slice(b"abc"), b"abc");
    }

    #[test]
    fn ids_follow_the_allocation() {
        let a = AlignedBuf::new(512);
        let id = a.id();
        assert_ne!(id, 0);
        assert_ne!(a.clone().id(), id, "a clone is another allocation");
        let moved = vec![a];
        assert_eq!(moved[0].id(), id, "moving keeps the id");
        drop(moved);
        // The allocator may hand the same address back; the id is new regardless.
        let b = AlignedBuf::new(512);
        assert!(b.id() > id);
    }
}
