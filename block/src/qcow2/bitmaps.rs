//! A qcow2 image's persistent dirty bitmaps, loaded at open, kept consistent in the file while
//! it is open, and stored at a clean close.
//!
//! This module owns the conversion between imago's bitmap data (QEMU's serialization: granule
//! `i` is bit `i % 8` of byte `i / 8`, whole 64-bit words) and [`DirtyBitmap`]'s words (QEMU's
//! in-memory layout: bit `i % 64` of word `i / 64`), which are the same bits read as
//! little-endian words; never the on-disk layout (imago's `bitmaps.rs`, `bitmaps_data.rs`).
//!
//! * **Loaded at open.** Every bitmap of the directory becomes a persistent [`DirtyBitmap`],
//!   recording iff its `auto` flag is set; one found `in_use` is loaded inconsistent, without
//!   its bits (QEMU's `load_bitmap`); one of an image opened read-only is read-only.
//! * **Kept consistent while open, through a crash** (beyond QEMU, which leaves every bitmap
//!   `in_use` while the image is open for writing, so a SIGKILL makes them all inconsistent).
//!   At a writable open, and when a persistent bitmap is added, each persistent consistent
//!   bitmap is stored again with every data cluster allocated, all-zero ones included, and
//!   `in_use` clear, then synced ([`Qcow2Image::keep_bitmaps`]): the file then holds a valid
//!   bitmap that QEMU and `qemu-img` read as consistent. From then on `durable.rs` keeps it
//!   a superset of every write: before a write, write-zeroes or discard is submitted (the
//!   request filter, `filter.rs`), the bitmap data cluster holding a granule it touches whose
//!   bit is not yet on disk is written in place (every bit on disk, in memory and of the
//!   write) and `fdatasync`ed; writes into granules already on disk cost an atomic load per
//!   bitmap word. That write is blocking, on the submitting iothread, once per run of 64
//!   granules first dirtied since the open, and makes the whole run durable (a crash shows it
//!   dirty: a superset; `durable.rs` has what it costs). Bits only grow on disk: a clear or a reset leaves the superset there
//!   until the clean close, a merge writes the merged bits before it returns, and a bitmap
//!   disabled or removed meanwhile still has every write set on disk. A resize marks the kept
//!   bitmaps `in_use` in place (their clusters cover the old size) until the clean close; an
//!   RBD image keeps QEMU's behaviour (`in_use` while open). Why before the submit and not
//!   before the completion is told: a write that reached the disk but was never answered
//!   (killed in between) must be in the bitmap too, or a backup would miss data the restarted
//!   guest reads.
//! * **Stored at a clean close.** [`Image::close`](crate::Image::close) (and dropping the
//!   image) stops keeping them, then writes every persistent bitmap that is not inconsistent,
//!   exactly as in memory (clears included, all-zero clusters dropped), with `in_use` clear, and
//!   removes from the image every bitmap of its directory that is no longer a persistent
//!   bitmap of the set (removed, or made transient). QEMU removes a bitmap from the file at
//!   `block-dirty-bitmap-remove`; here the file loses it at the clean close.

use std::io;
use std::sync::Arc;

use imago::qcow2::{BitmapData, BitmapEntry, Qcow2};

use super::storage::EngineStorage;
use super::{current, Qcow2Image};
use crate::bitmap::{BitmapSet, DirtyBitmap};

/// The words of `data` (little-endian), a partial last word padded with zeros.
fn words_of(data: &[u8]) -> Vec<u64> {
    data.chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// The bitmap of directory entry `entry` of `qcow2`, over `size` bytes: persistent,
/// recording iff its `auto` flag is set, inconsistent (without its bits) if found `in_use`.
async fn bitmap_of(
    qcow2: &Qcow2<EngineStorage>,
    entry: &BitmapEntry,
    size: u64,
) -> io::Result<DirtyBitmap> {
    let granularity = 1u32 << entry.granularity_bits;
    let bitmap = DirtyBitmap::new(&entry.name, size, granularity)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    bitmap.set_persistent(true);
    if !entry.auto {
        bitmap
            .set_recording(false)
            .map_err(|e| io::Error::other(e.to_string()))?;
    }
    if entry.in_use {
        bitmap.set_inconsistent();
    } else {
        let data = qcow2.read_bitmap(&entry.name).await.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("Could not read bitmap '{}' from image: {e}", entry.name),
            )
        })?;
        bitmap.or_words(&words_of(&data));
    }
    Ok(bitmap)
}

/// `bitmap` as imago stores it: its words in QEMU's serialization, padded to the image's
/// data size at its granularity.
fn data_of(qcow2: &Qcow2<EngineStorage>, bitmap: &DirtyBitmap) -> BitmapData {
    let granularity_bits = bitmap.granularity().trailing_zeros() as u8;
    let size = qcow2.bitmap_data_size(granularity_bits);
    let mut data: Vec<u8> = bitmap
        .to_words()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    data.resize(size, 0);
    BitmapData {
        name: bitmap.name().to_string(),
        granularity_bits,
        auto: bitmap.is_recording(),
        data,
    }
}

impl Qcow2Image {
    /// Keeps the persistent, consistent, writable ones of `bitmaps` consistent in the image
    /// while it is open (`durable.rs`): each stored now with every data cluster allocated and
    /// `in_use` clear, the directory and header synced, then written in place as writes dirty
    /// it. Nothing happens on an image not open for writing, or whose bitmaps cannot be
    /// written in place (an RBD image): there they stay `in_use` until the clean close.
    /// Blocking (waits for the image's lock): not on a thread running this image's requests.
    pub(crate) fn keep_bitmaps(&self, bitmaps: &[Arc<DirtyBitmap>]) -> io::Result<()> {
        if !self.writable.load(std::sync::atomic::Ordering::Acquire) || !self.durable.can_keep() {
            return Ok(());
        }
        let chosen: Vec<&Arc<DirtyBitmap>> = bitmaps
            .iter()
            .filter(|b| b.is_persistent() && !b.is_inconsistent() && !b.is_read_only())
            .collect();
        if chosen.is_empty() {
            return Ok(());
        }
        let stored = current::block_on(async {
            let access = self.access.read().await;
            let Some(qcow2) = access.downcast_ref::<Qcow2<EngineStorage>>() else {
                return Ok(Vec::new());
            };
            let data: Vec<BitmapData> = chosen.iter().map(|b| data_of(qcow2, b)).collect();
            qcow2.store_bitmaps_preallocated(&data, &[]).await?;
            let mut stored = Vec::new();
            for (bitmap, d) in chosen.iter().zip(&data) {
                match qcow2.bitmap_data_clusters(bitmap.name()).await {
                    Ok(clusters) => stored.push(((*bitmap).clone(), clusters, words_of(&d.data))),
                    Err(e) => {
                        // Stored consistent but not kept: in use again, or a crash would
                        // leave it missing writes.
                        let names: Vec<&str> = chosen.iter().map(|b| b.name()).collect();
                        qcow2.mark_bitmaps_in_use(&names).await?;
                        return Err(e);
                    }
                }
            }
            Ok::<_, io::Error>(stored)
        })?;
        // Each is kept even if writing what it gained since fails (the next write tries
        // again): a bitmap stored consistent and not kept could miss writes.
        let mut failed = None;
        for (bitmap, clusters, words) in &stored {
            if let Err(e) = self.durable.keep(bitmap, clusters.clone(), words) {
                failed.get_or_insert(e);
            }
        }
        // Those marked in use at open are consistent on disk again.
        let mut marked = self
            .bitmaps_marked_inconsistent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        marked.retain(|name| !stored.iter().any(|(b, _, _)| b.name() == name));
        failed.map_or(Ok(()), Err)
    }

    /// Makes `[offset, offset + len)` durable in every bitmap kept on disk before a change
    /// of that range runs (`durable.rs`).
    pub(crate) fn bitmaps_before_write(&self, offset: u64, len: u64) -> io::Result<()> {
        self.durable.before_write(offset, len)
    }

    /// The image's persistent bitmaps over `size` bytes, as the module says; `read_only`:
    /// marked read-only.
    pub(crate) fn load_bitmaps(&self, size: u64, read_only: bool) -> io::Result<Vec<DirtyBitmap>> {
        current::block_on(async {
            let access = self.access.read().await;
            let Some(qcow2) = access.downcast_ref::<Qcow2<EngineStorage>>() else {
                return Ok(Vec::new());
            };
            let mut loaded = Vec::new();
            for entry in qcow2.bitmaps() {
                let bitmap = bitmap_of(qcow2, &entry, size).await?;
                if read_only {
                    bitmap.set_read_only(true);
                }
                loaded.push(bitmap);
            }
            Ok(loaded)
        })
    }

    /// Persistent bitmap `name` of the nearest backing file opened from the header that has
    /// one (a raw layer ends the search: it has none), read-only, over that file's size.
    pub(crate) fn backing_file_bitmap(&self, name: &str) -> io::Result<Option<DirtyBitmap>> {
        current::block_on(async {
            let access = self.access.read().await;
            let mut layer = access
                .downcast_ref::<Qcow2<EngineStorage>>()
                .and_then(Qcow2::backing);
            while let Some(format) = layer {
                let Some(qcow2) = format.downcast_ref::<Qcow2<EngineStorage>>() else {
                    break;
                };
                if let Some(entry) = qcow2.bitmaps().into_iter().find(|e| e.name == name) {
                    let bitmap = bitmap_of(qcow2, &entry, format.size()).await?;
                    bitmap.set_read_only(true);
                    return Ok(Some(bitmap));
                }
                layer = qcow2.backing();
            }
            Ok(None)
        })
    }

    /// Stores the persistent, consistent bitmaps of `set` in the image (flag `in_use` clear)
    /// and removes from it those its directory has that `set` no longer holds as persistent.
    /// Nothing is written to an image that is not open for writing.
    pub(crate) fn store_bitmaps(&self, set: &BitmapSet) -> io::Result<()> {
        if !self.writable.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        // From now on the store below is what the image holds.
        self.durable.release_all();
        current::block_on(async {
            let access = self.access.read().await;
            match access.downcast_ref::<Qcow2<EngineStorage>>() {
                Some(qcow2) => store_set(qcow2, set).await,
                None => Ok(()),
            }
        })
    }
}

/// Stores the persistent, consistent bitmaps of `set` in `qcow2` (flag `in_use` clear) and
/// removes from it those its directory has that `set` no longer holds as persistent: a clean
/// close's store and an inactivation's.
pub(super) async fn store_set(qcow2: &Qcow2<EngineStorage>, set: &BitmapSet) -> io::Result<()> {
    let persistent: Vec<Arc<DirtyBitmap>> = set
        .list()
        .into_iter()
        .filter(|b| b.is_persistent())
        .collect();
    // The directory as it is now: bitmaps stored while open are in it too.
    let on_disk = qcow2.bitmap_directory();
    let store: Vec<BitmapData> = persistent
        .iter()
        .filter(|b| !b.is_inconsistent() && !b.is_read_only())
        .map(|b| data_of(qcow2, b))
        .collect();
    let remove: Vec<&str> = on_disk
        .iter()
        .map(|e| e.name.as_str())
        .filter(|name| !persistent.iter().any(|b| b.name() == *name))
        .collect();
    if store.is_empty() && remove.is_empty() {
        return Ok(());
    }
    qcow2.store_bitmaps(&store, &remove).await
}
