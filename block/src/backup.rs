//! A backup: a point-in-time copy of an image onto a target image, as QEMU's backup job
//! makes it (`block/backup.c`), in every sync mode `blockdev-backup` takes.
//!
//! This module owns what a backup marks to copy, its work loop and what it leaves a dirty
//! bitmap at its end; the copying and the copy-before-write it relies on are
//! [`crate::block_copy`]'s, the job's lifecycle (states, events, verbs) its caller's, told
//! through [`JobControl`].
//!
//! The contract:
//!
//! * **Point in time at the start.** [`Backup::start`] attaches copy-before-write to the
//!   source: what the target receives is the source as it was then, whatever is written
//!   meanwhile. A change submitted before the start and still in flight then may be in the
//!   copy or not (as with a crash at that moment); QEMU drains such changes first.
//! * **Sync modes** ([`SyncMode`]): `full` copies every chunk (holes as zeros), `top` too
//!   (an image whose backing chain is opened through it is read through its chain: its top
//!   is its whole content), `none` copies only what writes are about to change (the target
//!   is a fleecing image, read while the job runs, until it is cancelled), `bitmap` the
//!   chunks a dirty bitmap has set (`incremental` is `bitmap` with
//!   [`BitmapMode::OnSuccess`]).
//! * **The bitmap, as QEMU leaves it** ([`BitmapMode`]): its bits are taken at the start (the
//!   bitmap goes on recording what is written during the backup, QEMU's successor) and held
//!   busy. At the end, `on-success` keeps only what was written during a backup that
//!   succeeded and merges the taken bits back after a failure; `never` merges them back
//!   always; `always` merges back only what was not copied.
//! * **Progress in bytes**: the total is what was marked, done is what was copied, by the job
//!   or by writes of the source.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::bitmap::{BusyGuard, DirtyBitmap};
use crate::block_copy::{BlockCopy, BlockCopyError};
use crate::image::Image;

/// Which chunks a backup copies (QEMU's `MirrorSyncMode` as backup reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Every chunk.
    Full,
    /// The top layer's chunks (every chunk of an image read through its backing chain).
    Top,
    /// Only chunks a write is about to change, until the job is cancelled.
    None,
    /// The chunks a dirty bitmap has set.
    Bitmap,
}

/// What a backup leaves its bitmap at its end (QEMU's `BitmapSyncMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitmapMode {
    /// Only the writes made during the backup, if it succeeded; all bits back otherwise.
    OnSuccess,
    /// As it was, plus the writes made during the backup.
    Never,
    /// Cleared of what was copied, whether the backup succeeded or not.
    Always,
}

/// What the job around a backup lets its work know and be told.
pub trait JobControl {
    /// A pause point (QEMU's `job_pause_point`): returns once the job is not paused; true when
    /// it was cancelled (the work stops).
    fn checkpoint(&self) -> bool;

    /// `bytes` more of the work done (the job's progress); may wait to keep the job's speed
    /// limit, and returns early on a cancel.
    fn progress(&self, bytes: u64);

    /// Waits until the job is cancelled (a `none` backup's work: its copies are the writes').
    fn wait_for_cancel(&self);
}

/// The dirty bitmap a backup reads or leaves.
#[derive(Debug)]
struct BitmapUse {
    mode: BitmapMode,
    /// Its bits at the start.
    taken: Vec<u64>,
    busy: BusyGuard,
}

/// A backup of one image onto another, attached to the source from [`start`](Self::start)
/// to [`finish`](Self::finish). `Send + Sync`: its job runs it on a thread of its own, and
/// the job's end (on whichever thread finalizes it) finishes it.
#[derive(Debug)]
pub struct Backup {
    source: Arc<Image>,
    copy: Arc<BlockCopy>,
    sync: SyncMode,
    /// Taken by the first [`finish`](Backup::finish).
    bitmap: Mutex<Option<BitmapUse>>,
    total: u64,
    finished: AtomicBool,
}

/// Why a backup cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The two images do not make a copy.
    #[error(transparent)]
    Copy(#[from] BlockCopyError),
    /// The bitmap cannot be used.
    #[error(transparent)]
    Bitmap(#[from] crate::bitmap::BitmapError),
    /// `sync=bitmap` without a bitmap.
    #[error("a bitmap backup needs a bitmap")]
    NoBitmap,
}

impl Backup {
    /// Starts a backup of `source` onto `target`: what `sync` (and `bitmap`) says is marked
    /// to copy and copy-before-write is attached to the source. The bitmap, a bitmap of the
    /// source, is held busy until [`finish`](Self::finish).
    pub fn start(
        source: &Arc<Image>,
        target: Arc<Image>,
        sync: SyncMode,
        bitmap: Option<(Arc<DirtyBitmap>, BitmapMode)>,
    ) -> Result<Backup, BackupError> {
        let copy = Arc::new(BlockCopy::new(source, target)?);
        if sync == SyncMode::Bitmap && bitmap.is_none() {
            return Err(BackupError::NoBitmap);
        }
        let bitmap = match bitmap {
            Some((bitmap, mode)) => Some((bitmap.hold_busy()?, mode)),
            None => None,
        };
        let bitmap = bitmap.map(|(busy, mode)| {
            let taken = busy.bitmap().take_words();
            BitmapUse { mode, taken, busy }
        });
        match (&bitmap, sync) {
            (Some(used), SyncMode::Bitmap) => {
                let b = used.busy.bitmap();
                mark_words(&copy, &used.taken, u64::from(b.granularity()), b.size());
            }
            _ => copy.mark_all(),
        }
        let total = copy.remaining();
        source.start_copy_before_write(&copy)?;
        Ok(Backup {
            source: source.clone(),
            copy,
            sync,
            bitmap: Mutex::new(bitmap),
            total,
            finished: AtomicBool::new(false),
        })
    }

    /// The bytes marked to copy at the start (the job's total progress; QEMU reports the
    /// same for `none`).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The copy (its target, what is left).
    pub fn copy(&self) -> &Arc<BlockCopy> {
        &self.copy
    }

    /// The work, on the job's own thread, blocking: copies chunk after chunk until none is
    /// left (or, `none`, waits for the cancel), telling `control` its progress; then syncs
    /// the target. `Ok` also when cancelled: the caller knows.
    pub fn run(&self, control: &dyn JobControl) -> io::Result<()> {
        let mut told = 0;
        let mut tell = |control: &dyn JobControl| {
            let copied = self.copy.copied();
            if copied > told {
                control.progress(copied - told);
                told = copied;
            }
        };
        if self.sync == SyncMode::None {
            control.wait_for_cancel();
            tell(control);
            return Ok(());
        }
        loop {
            if control.checkpoint() {
                return Ok(());
            }
            let step = self.copy.copy_next()?;
            tell(control);
            if step.is_none() {
                break;
            }
        }
        // Chunks writes claimed are on the target before the backup says it is done.
        self.copy.wait_settled();
        tell(control);
        self.copy.target().flush_blocking()
    }

    /// Ends the backup: copy-before-write detached from the source, the bitmap left as its
    /// mode says for a backup that `succeeded` or not, and let go. Once: a second call does
    /// nothing.
    pub fn finish(&self, succeeded: bool) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.source.stop_copy_before_write(&self.copy);
        let used = self
            .bitmap
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(used) = used else {
            return;
        };
        let bitmap = used.busy.bitmap();
        match (used.mode, succeeded) {
            (BitmapMode::OnSuccess, true) => {}
            (BitmapMode::OnSuccess, false) | (BitmapMode::Never, _) => bitmap.or_words(&used.taken),
            (BitmapMode::Always, _) => {
                // What was taken and not copied is dirty still (whole chunks of the copy: a
                // superset where the bitmap's granules are smaller).
                let granularity = u64::from(bitmap.granularity());
                let still = DirtyBitmap::new("still", bitmap.size(), granularity as u32)
                    .expect("the bitmap's own granularity");
                still.or_words(&used.taken);
                for (offset, len) in self.copy.remaining_ranges() {
                    for (at, n, dirty) in still.extents(offset, len) {
                        if dirty {
                            bitmap.set(at, n);
                        }
                    }
                }
            }
        }
    }
}

/// Marks to copy the chunks of `copy` that the bitmap words `words` (granules of
/// `granularity` bytes over `size`) touch.
fn mark_words(copy: &BlockCopy, words: &[u64], granularity: u64, size: u64) {
    for (w, word) in words.iter().enumerate() {
        let mut bits = *word;
        while bits != 0 {
            let i = w as u64 * 64 + u64::from(bits.trailing_zeros());
            bits &= bits - 1;
            let offset = i * granularity;
            if offset < size {
                copy.mark(offset, granularity.min(size - offset));
            }
        }
    }
}

impl Drop for Backup {
    /// A backup dropped unfinished ends as a failed one: the source is not left copying
    /// before its writes for ever, and the bitmap gets its bits back.
    fn drop(&mut self) {
        self.finish(false);
    }
}
