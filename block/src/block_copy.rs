//! Copy-before-write: a point-in-time copy of an image taken while it is written (QEMU's
//! `block/block-copy.c` and the `copy-before-write` filter of `block/copy-before-write.c`).
//!
//! This module owns which chunks of a source image still have to reach a target image, who is
//! copying which, and the copy itself; a backup's job (what it marks, when it runs, what it
//! does with a dirty bitmap: [`crate::backup`]) and the request filter's hook
//! (`filter.rs`) are their own modules'.
//!
//! The contract:
//!
//! * **The target holds the source as it was.** Once a [`BlockCopy`] is attached to its
//!   source ([`Image::start_copy_before_write`]), a write, write-zeroes or discard of the
//!   source touching a chunk still to copy first copies that chunk's old data to the target,
//!   and only then is submitted. A chunk is copied once: by the first such write or by the
//!   job ([`BlockCopy::copy_next`]), whichever claims it first.
//! * **Nobody overtakes a copy.** A chunk being copied is claimed: a write of the source that
//!   touches it waits until the copy is on the target (QEMU's `block_copy_wait_one`), so
//!   the old data is never read after the new was written. Chunks are claimed in ascending
//!   order and the job never waits holding a claim, so two waiters never wait on each other.
//! * **A failed copy is not lost.** Its chunks are to copy again; a write whose copy failed
//!   fails unrun (QEMU's `on-cbw-error=break-guest-write`), the source untouched.
//! * **Holes stay holes.** A chunk the source's block status reports as a hole is written as
//!   zeros on the target (a qcow2 target stores no data for it), not read and copied.
//! * **Reads of the target through to the source see it as it was** (QEMU's fleecing rule,
//!   for a target whose backing is the source: a pull backup's scratch image): such a read
//!   holds the chunks it reads; a write of the source waits for the hold
//!   before it copies them, and the job copies them after it. A chunk copied meanwhile is read
//!   from the target.
//! * **Chunks of the target's cluster size**, at least 64 KiB (QEMU's
//!   `block_copy_calculate_cluster_size`), so a copy never writes part of a target cluster.
//!
//! Blocking: a copy runs on the thread that needs it (a job's own thread; for a write, the
//! submitting iothread, which waits for it as QEMU's guest write waits for its filter), with
//! the images' blocking I/O (`image/outside.rs`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};

use aio_core::engine::AlignedBuf;

use crate::image::hooks::{CopyHook, KindId, ReadHold};
use crate::image::Image;
use crate::status::ExtentKind;

/// The smallest chunk a copy moves, as QEMU's block-copy (its `BLOCK_COPY_CLUSTER_SIZE_DEFAULT`).
pub const MIN_CHUNK: u64 = 64 << 10;

/// The most one copy of the job moves at once (QEMU's `BLOCK_COPY_MAX_MEM`-bounded tasks).
pub const MAX_RUN: u64 = 1 << 20;

/// Why a copy cannot be set up between two images: QEMU's texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockCopyError {
    /// The source is the target.
    #[error("Source and target cannot be the same")]
    SameImage,
    /// Their sizes differ.
    #[error("Source and target image have different sizes")]
    DifferentSizes,
    /// The target takes no writes.
    #[error("Block node is read-only")]
    ReadOnlyTarget,
    /// The copy was made for another source.
    #[error("the copy was made for another source image")]
    OtherSource,
}

/// Which chunks are to copy and which are being copied: bit `i % 64` of word `i / 64`.
#[derive(Debug)]
struct Chunks {
    to_copy: Vec<u64>,
    claimed: Vec<u64>,
    /// Chunks copied (by the job or by a write).
    done: Vec<u64>,
    /// Reads of the target through to the source holding chunks (the fleecing rule), by
    /// chunk: a held chunk is not claimed.
    readers: HashMap<u64, u32>,
    /// Bytes of the chunks to copy.
    remaining: u64,
}

impl Chunks {
    /// Whether a party copies chunk `i` or a read holds it.
    fn busy(&self, i: u64) -> bool {
        bit(&self.claimed, i) || self.readers.contains_key(&i)
    }
}

/// Chunks held by a read of the target through to the source; let go when dropped.
#[derive(Debug)]
struct ReadGuard {
    copy: Arc<BlockCopy>,
    first: u64,
    last: u64,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        let mut st = self.copy.lock();
        for i in self.first..=self.last {
            if let Some(n) = st.readers.get_mut(&i) {
                *n -= 1;
                if *n == 0 {
                    st.readers.remove(&i);
                }
            }
        }
        drop(st);
        self.copy.settled.notify_all();
    }
}

fn bit(words: &[u64], i: u64) -> bool {
    words[(i / 64) as usize] & (1 << (i % 64)) != 0
}

fn put(words: &mut [u64], i: u64, on: bool) {
    let (w, b) = ((i / 64) as usize, 1u64 << (i % 64));
    if on {
        words[w] |= b;
    } else {
        words[w] &= !b;
    }
}

/// A run of chunks one party claimed: `[first, first + count)`.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: u64,
    count: u64,
}

/// The copy of one source image to one target, chunk by chunk. See the module's contract.
#[derive(Debug)]
pub struct BlockCopy {
    source: Weak<Image>,
    target: Arc<Image>,
    /// The target's kind, as a read through to the source names it (the fleecing rule).
    #[cfg_attr(not(feature = "qcow2"), allow(dead_code))]
    target_kind: KindId,
    chunk: u64,
    size: u64,
    state: Mutex<Chunks>,
    /// Told whenever a claim is let go.
    settled: Condvar,
    /// Bytes copied (data, or zeros for a hole), by the job and by writes.
    copied: AtomicU64,
}

impl BlockCopy {
    /// A copy of `source` to `target` with nothing marked to copy yet: checks QEMU's rules
    /// (two images, one size, a writable target).
    pub fn new(source: &Arc<Image>, target: Arc<Image>) -> Result<BlockCopy, BlockCopyError> {
        Self::check(source, &target)?;
        let chunk = target.cluster_size().unwrap_or(0).max(MIN_CHUNK);
        let size = source.size();
        let words = size.div_ceil(chunk).div_ceil(64).max(1) as usize;
        Ok(BlockCopy {
            source: Arc::downgrade(source),
            target_kind: target.kind_id(),
            target,
            chunk,
            size,
            state: Mutex::new(Chunks {
                to_copy: vec![0; words],
                claimed: vec![0; words],
                done: vec![0; words],
                readers: HashMap::new(),
                remaining: 0,
            }),
            settled: Condvar::new(),
            copied: AtomicU64::new(0),
        })
    }

    /// QEMU's checks of a copy from `source` to `target`, in its order: two images, one
    /// size, a writable target.
    pub fn check(source: &Arc<Image>, target: &Arc<Image>) -> Result<(), BlockCopyError> {
        if Arc::ptr_eq(source, target) {
            return Err(BlockCopyError::SameImage);
        }
        if source.size() != target.size() {
            return Err(BlockCopyError::DifferentSizes);
        }
        if target.is_read_only() {
            return Err(BlockCopyError::ReadOnlyTarget);
        }
        Ok(())
    }

    /// The chunk size.
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// The target image.
    pub fn target(&self) -> &Arc<Image> {
        &self.target
    }

    fn lock(&self) -> MutexGuard<'_, Chunks> {
        // Every change under the lock is a few word stores: a panic leaves them whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bytes of chunk `i` (the last one cut by the image's end).
    fn chunk_len(&self, i: u64) -> u64 {
        self.chunk.min(self.size - i * self.chunk)
    }

    /// The chunks `[offset, offset + len)` touches, clipped to the image.
    fn span(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
        let end = offset.saturating_add(len).min(self.size);
        (offset < end).then(|| (offset / self.chunk, (end - 1) / self.chunk))
    }

    /// Marks every chunk `[offset, offset + len)` touches to copy.
    pub fn mark(&self, offset: u64, len: u64) {
        let Some((first, last)) = self.span(offset, len) else {
            return;
        };
        let mut st = self.lock();
        for i in first..=last {
            if !bit(&st.to_copy, i) {
                put(&mut st.to_copy, i, true);
                st.remaining += self.chunk_len(i);
            }
        }
    }

    /// Marks the whole image to copy.
    pub fn mark_all(&self) {
        self.mark(0, self.size);
    }

    /// The bytes still to copy.
    pub fn remaining(&self) -> u64 {
        self.lock().remaining
    }

    /// The bytes copied so far, by the job and by writes of the source.
    pub fn copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// The ranges still to copy, in order, each `(offset, len)`.
    pub fn remaining_ranges(&self) -> Vec<(u64, u64)> {
        let st = self.lock();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for i in 0..self.size.div_ceil(self.chunk) {
            if bit(&st.to_copy, i) {
                let (at, len) = (i * self.chunk, self.chunk_len(i));
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == at => last.1 += len,
                    _ => out.push((at, len)),
                }
            }
        }
        out
    }

    /// Claims chunk `i` if it is to copy and nobody copies it.
    fn claim(&self, st: &mut Chunks, i: u64) -> bool {
        if !bit(&st.to_copy, i) || st.busy(i) {
            return false;
        }
        put(&mut st.to_copy, i, false);
        put(&mut st.claimed, i, true);
        st.remaining -= self.chunk_len(i);
        true
    }

    /// Lets `run` go: copied, or (`copied` false) to copy again.
    fn release(&self, run: Run, copied: bool) {
        let mut st = self.lock();
        let mut bytes = 0;
        for i in run.first..run.first + run.count {
            put(&mut st.claimed, i, false);
            put(&mut st.done, i, copied);
            bytes += self.chunk_len(i);
            if !copied {
                put(&mut st.to_copy, i, true);
                st.remaining += self.chunk_len(i);
            }
        }
        drop(st);
        if copied {
            self.copied.fetch_add(bytes, Ordering::Relaxed);
        }
        self.settled.notify_all();
    }

    /// The job's step: claims the first run of chunks to copy that nobody copies (at most
    /// [`MAX_RUN`] bytes) and copies it. `Ok(None)`: nothing is left to claim (chunks other
    /// parties copy may still be in flight: [`wait_settled`](Self::wait_settled)).
    pub fn copy_next(&self) -> io::Result<Option<u64>> {
        let source = self
            .source
            .upgrade()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the source image is gone"))?;
        let run = {
            let mut st = self.lock();
            let first = loop {
                let free = st
                    .to_copy
                    .iter()
                    .zip(&st.claimed)
                    .position(|(t, c)| t & !c != 0);
                let Some(w) = free else {
                    return Ok(None);
                };
                let word = st.to_copy[w] & !st.claimed[w];
                let first = w as u64 * 64 + u64::from(word.trailing_zeros());
                if !st.readers.contains_key(&first) {
                    break first;
                }
                // A read holds it: copied once the read is done.
                st = self
                    .settled
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
            };
            let most = (MAX_RUN / self.chunk).max(1);
            let chunks = self.size.div_ceil(self.chunk);
            let mut count = 0;
            while count < most && first + count < chunks && self.claim(&mut st, first + count) {
                count += 1;
            }
            Run { first, count }
        };
        let result = self.copy_run(&source, run);
        self.release(run, result.is_ok());
        result.map(|()| Some(self.run_bytes(run)))
    }

    /// Waits until no chunk is being copied.
    pub fn wait_settled(&self) {
        let mut st = self.lock();
        while st.claimed.iter().any(|w| *w != 0) {
            st = self
                .settled
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Before a change of `[offset, offset + len)` of `source` is submitted: the chunks it
    /// touches that are still to copy copied first, those being copied waited for.
    fn copy_before(&self, source: &Image, offset: u64, len: u64) -> io::Result<()> {
        let Some((first, last)) = self.span(offset, len) else {
            return Ok(());
        };
        let mut runs: Vec<Run> = Vec::new();
        {
            let mut st = self.lock();
            for i in first..=last {
                while st.busy(i) {
                    st = self
                        .settled
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if self.claim(&mut st, i) {
                    match runs.last_mut() {
                        Some(run) if run.first + run.count == i => run.count += 1,
                        _ => runs.push(Run { first: i, count: 1 }),
                    }
                }
            }
        }
        let mut result = Ok(());
        for run in runs {
            if result.is_ok() {
                result = self.copy_run(source, run);
            }
            self.release(run, result.is_ok());
        }
        result
    }

    fn run_bytes(&self, run: Run) -> u64 {
        let offset = run.first * self.chunk;
        (run.count * self.chunk).min(self.size - offset)
    }

    /// Copies `run` from `source` to the target: data read and written, holes written as
    /// zeros.
    fn copy_run(&self, source: &Image, run: Run) -> io::Result<()> {
        let (offset, len) = (run.first * self.chunk, self.run_bytes(run));
        let mut buf: Option<AlignedBuf> = None;
        for extent in source.block_status(offset, len)? {
            let end = (extent.offset + extent.len).min(offset + len);
            let at = extent.offset.max(offset);
            if at >= end {
                continue;
            }
            match extent.kind {
                ExtentKind::Hole => self.target.write_zeroes_at(at, end - at)?,
                ExtentKind::Data => {
                    let buf = buf.get_or_insert_with(|| AlignedBuf::new(len as usize));
                    let piece = &mut buf[..(end - at) as usize];
                    source.read_at(at, piece)?;
                    self.target.write_at(at, piece)?;
                }
            }
        }
        Ok(())
    }
}

impl CopyHook for BlockCopy {
    fn before_write(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.source.upgrade() {
            Some(source) => self.copy_before(&source, offset, len),
            None => Ok(()),
        }
    }

    fn target_is(&self, kind: KindId) -> bool {
        self.target_kind == kind
    }

    fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// The fleecing rule, for a read of the target through to the source over `[offset,
    /// offset + len)` (see [`ReadHold`]): waits while a chunk of it is being copied.
    fn hold_for_read(self: Arc<Self>, offset: u64, len: u64) -> ReadHold {
        let Some((first, last)) = self.span(offset, len) else {
            return ReadHold::Free;
        };
        let mut st = self.lock();
        while (first..=last).any(|i| bit(&st.claimed, i)) {
            st = self
                .settled
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if (first..=last).any(|i| bit(&st.done, i)) {
            return ReadHold::Copied;
        }
        if !(first..=last).any(|i| bit(&st.to_copy, i)) {
            return ReadHold::Free;
        }
        for i in first..=last {
            *st.readers.entry(i).or_insert(0) += 1;
        }
        drop(st);
        ReadHold::Held(Box::new(ReadGuard {
            copy: self,
            first,
            last,
        }))
    }
}

impl Image {
    /// Attaches `copy` to this image, its source: from now on every change of a chunk still to
    /// copy copies it first (see [`crate::block_copy`]). Several copies may be attached (two
    /// backups of one image).
    pub fn start_copy_before_write(&self, copy: &Arc<BlockCopy>) -> Result<(), BlockCopyError> {
        if !std::ptr::eq(copy.source.as_ptr(), self) {
            return Err(BlockCopyError::OtherSource);
        }
        self.copy_hooks().attach(copy.clone());
        Ok(())
    }

    /// Detaches `copy`: writes no longer wait for it.
    pub fn stop_copy_before_write(&self, copy: &Arc<BlockCopy>) {
        let it = Arc::as_ptr(copy) as *const ();
        self.copy_hooks()
            .detach(|c| std::ptr::eq(Arc::as_ptr(c) as *const (), it));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ImageOptions;

    /// A copy between two raw images of 1 MiB in a temporary directory, everything marked.
    fn copy() -> (tempfile::TempDir, Arc<Image>, BlockCopy) {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            let path = dir.path().join(name);
            std::fs::File::create(&path)
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
            Arc::new(Image::open(&path, ImageOptions::default()).unwrap())
        };
        let source = open("s");
        let copy = BlockCopy::new(&source, open("t")).unwrap();
        copy.mark_all();
        (dir, source, copy)
    }

    #[test]
    fn a_read_through_holds_its_chunks_against_copies_until_dropped() {
        let (_dir, _source, copy) = copy();
        let copy = Arc::new(copy);
        let hold = copy.clone().hold_for_read(70 << 10, 4096);
        assert!(matches!(hold, ReadHold::Held(_)));
        {
            let mut st = copy.lock();
            assert!(!copy.claim(&mut st, 1), "the held chunk is not claimed");
            assert!(copy.claim(&mut st, 0), "another chunk is");
            drop(st);
            copy.release(Run { first: 0, count: 1 }, false);
        }
        drop(hold);
        let mut st = copy.lock();
        assert!(copy.claim(&mut st, 1), "let go: claimed");
    }

    #[test]
    fn a_copied_chunk_is_read_from_the_target_and_an_unmarked_one_is_free() {
        let (_dir, source, copy) = copy();
        let copy = Arc::new(copy);
        copy.copy_before(&source, 0, 4096).unwrap();
        assert!(matches!(
            copy.clone().hold_for_read(0, 4096),
            ReadHold::Copied
        ));
        assert_eq!(copy.copied(), MIN_CHUNK);
        let other = Arc::new(BlockCopy::new(&source, copy.target().clone()).unwrap());
        assert!(matches!(other.hold_for_read(0, 4096), ReadHold::Free));
    }
}
