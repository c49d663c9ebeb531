//! Dirty bitmaps: which parts of an image were written since a point in time, as QEMU's
//! `BdrvDirtyBitmap` tracks them for incremental backup and mirroring.
//!
//! This module owns one bitmap ([`DirtyBitmap`]: its bits, granularity and states) and an
//! image's set of them ([`BitmapSet`], `set.rs`); it never decides when a request dirties
//! the image (that is the request filter's, `filter.rs`) nor what is stored in a qcow2
//! image (the `qcow2` module's).
//!
//! * **One bit per chunk.** A bitmap covers its image's bytes in chunks of its granularity
//!   (a power of two, at least 512 bytes; by default the image's cluster size within 4-64 KiB,
//!   64 KiB for an image without clusters: QEMU's rule). A chunk is dirty when any byte of it
//!   was written, zeroed or discarded; [`count`](DirtyBitmap::count) counts whole chunks, as
//!   QEMU's `count` does.
//! * **Shared by every writer.** A bitmap is `Send + Sync`: each iothread serving the image
//!   sets bits with atomic ORs, so two queues dirtying one word lose nothing. A resize takes
//!   the bits exclusively, for the moment it grows or shrinks them.
//! * **States, as QEMU reports them.** Recording (enabled) or disabled; busy while an export
//!   or a job uses it ([`BusyGuard`]); persistent (kept in the qcow2 image); inconsistent (found
//!   `in_use` in an image that was not closed cleanly: it may have missed writes, so it can
//!   only be removed); read-only (loaded from an image opened read-only). A busy, read-only
//!   or inconsistent bitmap refuses changes with QEMU's texts ([`BitmapError`]).
//! * **Kept on disk by its image.** A persistent bitmap of a writable qcow2 image is kept
//!   consistent in the file while the image is open (`qcow2/durable.rs`); a merge into one
//!   tells its image (a crate-private hook), so the merged bits are on disk before the merge returns.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, Weak};

mod error;
mod set;
#[cfg(test)]
mod tests;

pub use error::BitmapError;
pub use set::{BitmapOptions, BitmapSet};

/// QEMU's longest bitmap name (`BDRV_BITMAP_MAX_NAME_SIZE`), in bytes.
pub const MAX_NAME_BYTES: usize = 1023;

/// The smallest granularity QEMU accepts.
pub const MIN_GRANULARITY: u32 = 512;

/// QEMU's default granularity for an image whose cluster size is `cluster` (None: an image
/// without clusters, a raw file): the cluster size within 4 KiB to 64 KiB, else 64 KiB.
pub fn default_granularity(cluster: Option<u64>) -> u32 {
    match cluster {
        Some(c) if c > 0 => c.clamp(4096, 65536) as u32,
        _ => 65536,
    }
}

/// Checks a granularity the user asked for, with QEMU's text.
pub fn check_granularity(granularity: u32) -> Result<(), BitmapError> {
    if granularity < MIN_GRANULARITY || !granularity.is_power_of_two() {
        return Err(BitmapError::Granularity);
    }
    Ok(())
}

/// The bits and the size they cover, changed together by a resize.
#[derive(Debug)]
struct Bits {
    /// The covered image's size in bytes.
    size: u64,
    /// Chunk `i` is bit `i % 64` of word `i / 64`; at least one word (QEMU's layout).
    words: Vec<AtomicU64>,
}

impl Bits {
    fn new(size: u64, shift: u32) -> Bits {
        let mut bits = Bits {
            size: 0,
            words: Vec::new(),
        };
        bits.resize(size, shift);
        bits
    }

    /// The chunk count for `size` bytes: at least one, as QEMU's `hbitmap_alloc`.
    fn chunks(size: u64, shift: u32) -> u64 {
        size.div_ceil(1 << shift).max(1)
    }

    fn resize(&mut self, size: u64, shift: u32) {
        let chunks = Self::chunks(size, shift);
        let words = chunks.div_ceil(64) as usize;
        self.words.resize_with(words, || AtomicU64::new(0));
        self.size = size;
        // Chunks past the new end are clean (they are dirtied again if the image grows and
        // they are written).
        self.mask_tail(shift);
    }

    /// Clears the bits of the last word past the last chunk.
    fn mask_tail(&self, shift: u32) {
        let used = Self::chunks(self.size, shift) % 64;
        if let (Some(last), true) = (self.words.last(), used != 0) {
            last.fetch_and((1u64 << used) - 1, Ordering::Relaxed);
        }
    }

    /// Calls `word(index, mask)` for each word holding chunks `[first, last]`, with the mask
    /// of those chunks in it.
    fn for_words(first: u64, last: u64, mut word: impl FnMut(usize, u64)) {
        let (fw, lw) = (first / 64, last / 64);
        for w in fw..=lw {
            let lo = if w == fw { first % 64 } else { 0 };
            let hi = if w == lw { last % 64 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            word(w as usize, mask);
        }
    }
}

/// What keeps a bitmap's bits on disk as they are set outside a write (a qcow2 image's
/// crash-consistent bitmaps, `qcow2/durable.rs`): told after a merge added bits.
pub(crate) trait BitsAdded: Send + Sync + std::fmt::Debug {
    /// `bitmap` gained bits that no write set.
    fn bits_added(&self, bitmap: &DirtyBitmap);
}

/// One dirty bitmap of an image. See the module's contract.
#[derive(Debug)]
pub struct DirtyBitmap {
    name: String,
    /// log2 of the granularity.
    shift: u32,
    bits: RwLock<Bits>,
    recording: AtomicBool,
    persistent: AtomicBool,
    inconsistent: AtomicBool,
    read_only: AtomicBool,
    /// Users that hold it busy (exports, jobs).
    busy: AtomicU32,
    /// What keeps it on disk while its image is open (None: nothing does).
    durability: RwLock<Option<Weak<dyn BitsAdded>>>,
}

/// Holds a bitmap busy (an export serving it, a job using it) until dropped.
#[derive(Debug)]
pub struct BusyGuard {
    bitmap: Arc<DirtyBitmap>,
}

impl BusyGuard {
    /// The bitmap held.
    pub fn bitmap(&self) -> &Arc<DirtyBitmap> {
        &self.bitmap
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.bitmap.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl DirtyBitmap {
    /// A clean bitmap named `name` over `size` bytes in chunks of `granularity` bytes,
    /// recording. Checks the name (not empty, at most [`MAX_NAME_BYTES`]) and the granularity
    /// ([`check_granularity`]).
    pub fn new(name: &str, size: u64, granularity: u32) -> Result<DirtyBitmap, BitmapError> {
        if name.is_empty() {
            return Err(BitmapError::EmptyName);
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(BitmapError::NameTooLong(name.to_string()));
        }
        check_granularity(granularity)?;
        let shift = granularity.trailing_zeros();
        Ok(DirtyBitmap {
            name: name.to_string(),
            shift,
            bits: RwLock::new(Bits::new(size, shift)),
            recording: AtomicBool::new(true),
            persistent: AtomicBool::new(false),
            inconsistent: AtomicBool::new(false),
            read_only: AtomicBool::new(false),
            busy: AtomicU32::new(0),
            durability: RwLock::new(None),
        })
    }

    /// Sets (or, None, drops) what keeps it on disk while its image is open.
    #[cfg(feature = "qcow2")]
    pub(crate) fn set_durability(&self, durability: Option<Weak<dyn BitsAdded>>) {
        *self.durability.write().unwrap_or_else(|e| e.into_inner()) = durability;
    }

    /// Tells what keeps it on disk that it gained bits no write set.
    fn tell_bits_added(&self) {
        let durability = self
            .durability
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(d) = durability.and_then(|d| d.upgrade()) {
            d.bits_added(self);
        }
    }

    fn bits(&self) -> RwLockReadGuard<'_, Bits> {
        // A panic while the bits were held left nothing half-written (each change is one
        // atomic per word): the bits are still good.
        self.bits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its granularity in bytes.
    pub fn granularity(&self) -> u32 {
        1 << self.shift
    }

    /// The size in bytes it covers (its image's).
    pub fn size(&self) -> u64 {
        self.bits().size
    }

    /// Whether writes set its bits (QEMU's `recording`: not disabled).
    pub fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Acquire)
    }

    /// Whether it is kept in the image (a qcow2 image's bitmaps extension).
    pub fn is_persistent(&self) -> bool {
        self.persistent.load(Ordering::Acquire)
    }

    /// Whether it was found `in_use` in an image that was not closed cleanly.
    pub fn is_inconsistent(&self) -> bool {
        self.inconsistent.load(Ordering::Acquire)
    }

    /// Whether it was loaded from an image opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Whether an export or a job holds it ([`hold_busy`](Self::hold_busy)).
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    /// Marks it persistent or not.
    pub fn set_persistent(&self, persistent: bool) {
        self.persistent.store(persistent, Ordering::Release);
    }

    /// Marks it inconsistent (loaded from an image left `in_use`); it stops recording.
    pub fn set_inconsistent(&self) {
        self.inconsistent.store(true, Ordering::Release);
        self.recording.store(false, Ordering::Release);
    }

    /// Marks it read-only (loaded from an image opened read-only).
    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    /// Holds it busy until the guard drops. Refused with QEMU's text when it is busy already,
    /// or inconsistent.
    pub fn hold_busy(self: &Arc<Self>) -> Result<BusyGuard, BitmapError> {
        if self.is_inconsistent() {
            return Err(BitmapError::Inconsistent(self.name.clone()));
        }
        self.busy
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| BitmapError::Busy(self.name.clone()))?;
        Ok(BusyGuard {
            bitmap: self.clone(),
        })
    }

    /// Checks that it may be removed (`block-dirty-bitmap-remove`): not busy, not read-only,
    /// in QEMU's order; an inconsistent one may be removed (QEMU's hint says to).
    pub fn check_removable(&self) -> Result<(), BitmapError> {
        if self.is_busy() {
            return Err(BitmapError::Busy(self.name.clone()));
        }
        if self.is_read_only() {
            return Err(BitmapError::ReadOnly(self.name.clone()));
        }
        Ok(())
    }

    /// Holds it busy for its removal until the guard drops (a transaction's
    /// `block-dirty-bitmap-remove`, prepared: every later user is refused, as QEMU marks it
    /// busy until the commit), checked as [`check_removable`](Self::check_removable).
    pub fn hold_for_removal(self: &Arc<Self>) -> Result<BusyGuard, BitmapError> {
        self.check_removable()?;
        self.busy
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| BitmapError::Busy(self.name.clone()))?;
        Ok(BusyGuard {
            bitmap: self.clone(),
        })
    }

    /// Checks that its bits may be changed by the user (`block-dirty-bitmap-clear`, a merge
    /// into it): not busy, not read-only, not inconsistent, in QEMU's order
    /// (`bdrv_dirty_bitmap_check`).
    pub fn check_writable(&self) -> Result<(), BitmapError> {
        self.check_removable()?;
        self.check_usable()
    }

    /// Checks that it may be used (read by a job or a merge): not busy, not inconsistent.
    pub fn check_usable(&self) -> Result<(), BitmapError> {
        if self.is_busy() {
            return Err(BitmapError::Busy(self.name.clone()));
        }
        if self.is_inconsistent() {
            return Err(BitmapError::Inconsistent(self.name.clone()));
        }
        Ok(())
    }

    /// Starts or stops recording (`block-dirty-bitmap-enable`, `-disable`), checked as
    /// [`check_usable`](Self::check_usable): a read-only bitmap may start or stop recording,
    /// as QEMU allows (`BDRV_BITMAP_ALLOW_RO`), for that changes none of its bits.
    pub fn set_recording(&self, recording: bool) -> Result<(), BitmapError> {
        self.check_usable()?;
        self.recording.store(recording, Ordering::Release);
        Ok(())
    }

    /// The chunks `[first, last]` of the byte range `[offset, offset + len)`, clipped to the
    /// size; None when nothing of it is inside.
    fn chunk_span(&self, bits: &Bits, offset: u64, len: u64) -> Option<(u64, u64)> {
        let end = offset.saturating_add(len).min(bits.size);
        if len == 0 || offset >= end {
            return None;
        }
        Some((offset >> self.shift, (end - 1) >> self.shift))
    }

    /// Sets the chunks `[offset, offset + len)` touches (what a write does), whether or not
    /// it records: the request filter asks only recording bitmaps.
    pub fn set(&self, offset: u64, len: u64) {
        let bits = self.bits();
        if let Some((first, last)) = self.chunk_span(&bits, offset, len) {
            Bits::for_words(first, last, |w, mask| {
                // Relaxed is enough: a reader that must see this write's bit (a backup's
                // transaction) drains the write first, and the drain orders it.
                bits.words[w].fetch_or(mask, Ordering::Relaxed);
            });
        }
    }

    /// Clears the chunks wholly inside `[offset, offset + len)` (the range a backup has
    /// copied); a chunk only partly inside stays as it is.
    pub fn reset(&self, offset: u64, len: u64) {
        let bits = self.bits();
        let g = u64::from(self.granularity());
        let first = offset.div_ceil(g);
        let end = offset.saturating_add(len).min(bits.size);
        // A last chunk cut by the image's end counts as whole when the range reaches the end.
        let stop = if end == bits.size {
            end.div_ceil(g)
        } else {
            end / g
        };
        if stop <= first {
            return;
        }
        Bits::for_words(first, stop - 1, |w, mask| {
            bits.words[w].fetch_and(!mask, Ordering::Relaxed);
        });
    }

    /// Clears every bit (`block-dirty-bitmap-clear`: no check here).
    pub fn clear(&self) {
        for w in self.bits().words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the chunk holding `offset` is dirty.
    pub fn is_dirty(&self, offset: u64) -> bool {
        let bits = self.bits();
        if offset >= bits.size {
            return false;
        }
        let chunk = offset >> self.shift;
        bits.words[(chunk / 64) as usize].load(Ordering::Relaxed) & (1 << (chunk % 64)) != 0
    }

    /// The dirty bytes: dirty chunks times the granularity (QEMU's `count`).
    pub fn count(&self) -> u64 {
        let bits = self.bits();
        let set: u64 = bits
            .words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum();
        set << self.shift
    }

    /// The dirty extents of `[offset, offset + len)` in order, each `(offset, len, dirty)`,
    /// covering the range (clipped to the size) without a gap; whole chunks, except where the
    /// range or the image cuts one.
    pub fn extents(&self, offset: u64, len: u64) -> Vec<(u64, u64, bool)> {
        let bits = self.bits();
        let end = offset.saturating_add(len).min(bits.size);
        let mut out: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = offset;
        while at < end {
            let chunk = at >> self.shift;
            let next = ((chunk + 1) << self.shift).min(end);
            let dirty = bits.words[(chunk / 64) as usize].load(Ordering::Relaxed)
                & (1 << (chunk % 64))
                != 0;
            match out.last_mut() {
                Some(last) if last.2 == dirty => last.1 += next - at,
                _ => out.push((at, next - at, dirty)),
            }
            at = next;
        }
        out
    }

    /// Sets every chunk dirty in `source` (`block-dirty-bitmap-merge`). The two must cover
    /// the same size; granularities may differ (a source chunk dirties every chunk of this
    /// one it touches).
    pub fn merge_from(&self, source: &DirtyBitmap) -> Result<(), BitmapError> {
        if std::ptr::eq(self, source) {
            return Ok(());
        }
        let (size, source_size) = (self.size(), source.size());
        if size != source_size {
            return Err(BitmapError::SizeMismatch {
                destination: size,
                source_size,
            });
        }
        if self.shift == source.shift {
            let (to, from) = (self.bits(), source.bits());
            for (t, f) in to.words.iter().zip(from.words.iter()) {
                t.fetch_or(f.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        } else {
            for (offset, len, dirty) in source.extents(0, source_size) {
                if dirty {
                    self.set(offset, len);
                }
            }
        }
        // A bitmap its image keeps on disk has the merged bits there before the merge returns.
        self.tell_bits_added();
        Ok(())
    }

    /// Grows or shrinks it with its image (new chunks clean).
    pub fn resize(&self, size: u64) {
        let mut bits = self.bits.write().unwrap_or_else(|e| e.into_inner());
        bits.resize(size, self.shift);
    }

    /// Its bits as QEMU lays them out in memory (64-bit words, little-endian, chunk `i` bit
    /// `i % 64` of word `i / 64`), which a qcow2 image stores and a SHA-256 is taken of.
    pub fn to_words(&self) -> Vec<u64> {
        self.bits()
            .words
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }

    /// Its bits, as [`to_words`](Self::to_words) lays them out, taken: each word read and
    /// cleared in one atomic step, so a write that completes meanwhile is either in what is
    /// returned or set in the bitmap after, never lost (a backup's start: QEMU's successor
    /// bitmap).
    pub fn take_words(&self) -> Vec<u64> {
        self.bits()
            .words
            .iter()
            .map(|w| w.swap(0, Ordering::AcqRel))
            .collect()
    }

    /// The words `range` of [`to_words`](Self::to_words) (those past its end left out).
    #[cfg(feature = "qcow2")]
    pub(crate) fn words_in(&self, range: std::ops::Range<usize>) -> Vec<u64> {
        let bits = self.bits();
        let end = range.end.min(bits.words.len());
        let start = range.start.min(end);
        bits.words[start..end]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }

    /// Sets the chunks whose bits are set in `words` (the layout of
    /// [`to_words`](Self::to_words)); words past its size are ignored.
    pub fn or_words(&self, words: &[u64]) {
        let bits = self.bits();
        for (t, f) in bits.words.iter().zip(words) {
            t.fetch_or(*f, Ordering::Relaxed);
        }
        // Bits past the last chunk stay clear.
        bits.mask_tail(self.shift);
    }

    /// The SHA-256 of its bits in hex, as QEMU's `x-debug-block-dirty-bitmap-sha256` gives it
    /// (the hash of [`to_words`](Self::to_words) in little-endian bytes).
    pub fn sha256_hex(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for w in self.to_words() {
            hash.update(w.to_le_bytes());
        }
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}
