//! The guest's RAM in a matrix cell, and which path its data takes to the engine.
//!
//! This module owns the one guest-RAM region of a cell (an anonymous shared mapping, as a
//! VMM maps its guest's memory for its device threads) and the layout of the guests' request
//! slots in it. It never submits I/O; the iothread (`scsi/mod.rs`) points requests into it or,
//! with `--bounce`, copies through its own buffers, and the guests (`scsi/guest.rs`) prepare
//! and check their data in it.

use std::fmt;
use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::str::FromStr;

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// How a request's data travels between guest RAM and the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryPath {
    /// The engine reads into and writes from guest RAM itself
    /// ([`GuestIovecs`](aio_core::engine::GuestIovecs)): no copy, as QEMU does for aligned
    /// guest buffers.
    #[default]
    Guest,
    /// The iothread copies guest RAM into an [`AlignedBuf`](aio_core::engine::AlignedBuf)
    /// before a write and from it back into guest RAM after a read, as QEMU's bounce buffers
    /// do (`--bounce`).
    Bounce,
}

impl MemoryPath {
    /// Both paths, guest first.
    pub const ALL: [MemoryPath; 2] = [MemoryPath::Guest, MemoryPath::Bounce];

    /// The name used in reports (`memory` in the JSON and CSV): `guest` or `bounce`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryPath::Guest => "guest",
            MemoryPath::Bounce => "bounce",
        }
    }
}

impl fmt::Display for MemoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MemoryPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        MemoryPath::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown memory path '{s}' (expected guest or bounce)"))
    }
}

/// The guest RAM of one cell: one page-aligned anonymous shared mapping holding every driven
/// disk's request slots, `bs` bytes each (slot `s` of disk `d` at `(d * iodepth + s) * bs`).
///
/// A slot belongs to its guest while no request is in flight on it, and to the iothread and
/// the engine from the moment the guest puts its request on the available ring until the
/// iothread puts the request's entry on the used ring. The rings' locks order the two sides'
/// accesses. The mapping is removed on drop: whoever holds the last reference must do so
/// after every engine that could still touch it has been dropped.
pub(crate) struct GuestRam {
    base: NonNull<u8>,
    len: NonZeroUsize,
    iodepth: usize,
    bs: usize,
}

// SAFETY: the mapping is process memory like a heap allocation; the slot protocol above (each
// slot touched by one side at a time, handed over under the rings' locks) is what makes
// access from the guest threads and the iothread sound, and every access goes through the
// `unsafe` slot accessors whose callers keep it.
unsafe impl Send for GuestRam {}
// SAFETY: as for `Send`: shared references give out raw addresses only.
unsafe impl Sync for GuestRam {}

impl GuestRam {
    /// Maps `disks * iodepth * bs` bytes, page aligned, every byte set to a non-zero pattern,
    /// as a guest's buffers hold data.
    pub(crate) fn new(disks: usize, iodepth: usize, bs: usize) -> io::Result<GuestRam> {
        let bytes = disks
            .checked_mul(iodepth)
            .and_then(|n| n.checked_mul(bs))
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("guest RAM of {disks} disks x {iodepth} slots x {bs} bytes"),
                )
            })?;
        // The kernel rounds the mapping up to whole pages, and its start is page aligned.
        let len = NonZeroUsize::new(bytes).expect("non-zero");
        // SAFETY: a fresh mapping at an address the kernel picks: it aliases nothing, and it
        // is unmapped only by `drop`.
        let base = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
            )
        }
        .map_err(io::Error::from)?
        .cast::<u8>();
        // SAFETY: the mapping is ours alone until this returns; `len` bytes are mapped.
        unsafe { std::ptr::write_bytes(base.as_ptr(), 0x5a, len.get()) };
        Ok(GuestRam {
            base,
            len,
            iodepth,
            bs,
        })
    }

    /// Bytes per slot (the cell's block size).
    pub(crate) fn bs(&self) -> usize {
        self.bs
    }

    /// The address of slot `slot` of driven disk `disk` (`bs` bytes there are mapped).
    pub(crate) fn slot_ptr(&self, disk: usize, slot: u32) -> *mut u8 {
        let index = disk * self.iodepth + slot as usize;
        assert!(
            (index + 1) * self.bs <= self.len.get(),
            "slot outside guest RAM"
        );
        // SAFETY: in bounds of the mapping (checked above).
        unsafe { self.base.as_ptr().add(index * self.bs) }
    }

    /// Slot `slot` of disk `disk`, to read.
    ///
    /// # Safety
    ///
    /// The caller owns the slot (see the type's docs) for the life of the slice: no request is
    /// in flight on it and no other thread touches it.
    pub(crate) unsafe fn slot(&self, disk: usize, slot: u32) -> &[u8] {
        // SAFETY: mapped (slot_ptr); unaliased by the caller's promise.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(disk, slot), self.bs) }
    }

    /// Slot `slot` of disk `disk`, to write.
    ///
    /// # Safety
    ///
    /// As for [`GuestRam::slot`].
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slot_mut(&self, disk: usize, slot: u32) -> &mut [u8] {
        // SAFETY: mapped (slot_ptr); unaliased by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(disk, slot), self.bs) }
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of `len` bytes; the owner's contract (see the type) is that
        // no engine can touch it any more.
        let _ = unsafe { munmap(self.base.cast(), self.len.get()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_aligned_and_filled() {
        let ram = GuestRam::new(2, 3, 4096).unwrap();
        assert_eq!(ram.slot_ptr(0, 0) as usize % 4096, 0, "page aligned");
        assert_eq!(
            ram.slot_ptr(1, 0) as usize - ram.slot_ptr(0, 0) as usize,
            3 * 4096
        );
        // SAFETY: no request is in flight; this thread is the only user.
        let s = unsafe { ram.slot_mut(1, 2) };
        assert!(s.iter().all(|&b| b == 0x5a));
        s.fill(1);
        // SAFETY: as above.
        assert!(unsafe { ram.slot(1, 1) }.iter().all(|&b| b == 0x5a));
        assert!(std::panic::catch_unwind(|| ram.slot_ptr(2, 0)).is_err());
        assert_eq!("bounce".parse::<MemoryPath>(), Ok(MemoryPath::Bounce));
        assert!("copy".parse::<MemoryPath>().unwrap_err().contains("copy"));
    }
}
