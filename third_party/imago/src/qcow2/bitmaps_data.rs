//! Persistent dirty bitmaps: their tables and data, read and stored.
//!
//! A bitmap's data is its bits in QEMU's serialization (`hbitmap_serialize_part`): granule `i`
//! is bit `i % 8` of byte `i / 8`, in whole 64-bit words; the data is cut in clusters, each
//! named by one entry of the bitmap table (0: all zeros, 1: all ones, else the cluster's
//! offset). Storing writes every bitmap given anew (data clusters, skipping all-zero ones as
//! QEMU's `store_bitmap_data` does, then the table), then a new directory, then the header
//! (the extension and the `bitmaps` autoclear bit) and a sync; only then are the replaced
//! directory, tables and data clusters freed. A failure before the header is written frees
//! what was allocated and leaves the image as it was.
//!
//! aio-rs keeps bitmaps consistent while the image is open: it stores them preallocated
//! ([`Qcow2::store_bitmaps_preallocated()`], every data cluster written, all-zero ones too),
//! learns where their data clusters are ([`Qcow2::bitmap_data_clusters()`]) and writes those
//! in place itself; [`Qcow2::mark_bitmaps_in_use()`] marks some `in_use` again in place.
//!
//! This module owns the bitmap tables and data and the storing of a new directory; never the
//! directory's layout and checks (`bitmaps.rs`).

use super::bitmaps::{self, BitmapEntry, Extension};
use super::*;
use crate::misc_helpers::invalid_data;

/// Mask of a bitmap table entry's reserved bits.
const TABLE_ENTRY_RESERVED: u64 = 0xff00_0000_0000_01fe;

/// Mask of a bitmap table entry's offset.
const TABLE_ENTRY_OFFSET: u64 = 0x00ff_ffff_ffff_fe00;

/// Flag of a bitmap table entry without data: every bit set.
const TABLE_ENTRY_ALL_ONES: u64 = 1;

/// A bitmap to store with [`Qcow2::store_bitmaps()`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapData {
    /// Its name (at most [`MAX_NAME_SIZE`](super::MAX_NAME_SIZE) bytes).
    pub name: String,
    /// log2 of its granularity in bytes.
    pub granularity_bits: u8,
    /// Whether it records writes (stored with the `auto` flag).
    pub auto: bool,
    /// Its bits in QEMU's serialization: granule `i` is bit `i % 8` of byte `i / 8`;
    /// [`Qcow2::bitmap_data_size()`] bytes.
    pub data: Vec<u8>,
}

#[maybe_async]
impl<S: Storage + 'static, F: WrappedFormat<S> + 'static> Qcow2<S, F> {
    /// The persistent dirty bitmaps the bitmap directory held when the image was opened, with
    /// the flags found (a writable open has marked them `in_use` on disk since).
    pub fn bitmaps(&self) -> Vec<BitmapEntry> {
        self.header.bitmaps().found.clone()
    }

    /// The persistent dirty bitmaps the bitmap directory holds now: those found at open, as
    /// changed by the stores since (aio-rs: bitmaps stored while the image is open).
    pub fn bitmap_directory(&self) -> Vec<BitmapEntry> {
        self.header.bitmaps().entries.clone()
    }

    /// The bytes of a bitmap's data at `granularity_bits` for this image's size (QEMU's
    /// serialization size: whole 64-bit words of bits).
    pub fn bitmap_data_size(&self, granularity_bits: u8) -> usize {
        bitmaps::data_size(self.header.size(), granularity_bits) as usize
    }

    /// Reads the bitmap table at `offset` of `size` entries, each entry checked.
    async fn read_bitmap_table(&self, offset: u64, size: u32) -> io::Result<Vec<u64>> {
        let mut buf = vec![0u8; size as usize * 8];
        self.metadata.read(&mut buf[..], offset).await?;
        let cs = self.header.cluster_size() as u64;
        buf.chunks_exact(8)
            .map(|b| {
                let entry = u64::from_be_bytes(b.try_into().unwrap());
                let at = entry & TABLE_ENTRY_OFFSET;
                let bad = entry & TABLE_ENTRY_RESERVED != 0
                    || (at != 0 && (entry & TABLE_ENTRY_ALL_ONES != 0 || at % cs != 0));
                match bad {
                    true => Err(invalid_data(format!(
                        "Invalid bitmap table entry {entry:#x}"
                    ))),
                    false => Ok(entry),
                }
            })
            .collect()
    }

    /// Reads the data of the bitmap named `name` (as the directory has it now), in QEMU's
    /// serialization ([`BitmapData::data`]), [`bitmap_data_size()`](Self::bitmap_data_size)
    /// bytes. The bits of a bitmap found `in_use` are read as they are, untrustworthy.
    pub async fn read_bitmap(&self, name: &str) -> io::Result<Vec<u8>> {
        let entry = self
            .header
            .bitmaps()
            .entries
            .iter()
            .find(|e| e.name == name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("No bitmap {name}")))?;
        let size = self.bitmap_data_size(entry.granularity_bits);
        let cs = self.header.cluster_size();
        if size.div_ceil(cs) != entry.table_size as usize {
            return Err(invalid_data(format!(
                "Could not read bitmap '{name}' from image: its table has {} entries",
                entry.table_size
            )));
        }
        let table = self
            .read_bitmap_table(entry.table_offset, entry.table_size)
            .await?;
        let mut data = vec![0u8; size];
        let mut cluster = vec![0u8; cs];
        for (chunk, entry) in data.chunks_mut(cs).zip(table) {
            let at = entry & TABLE_ENTRY_OFFSET;
            if at != 0 {
                self.metadata.read(&mut cluster[..], at).await?;
                chunk.copy_from_slice(&cluster[..chunk.len()]);
            } else if entry & TABLE_ENTRY_ALL_ONES != 0 {
                chunk.fill(0xff);
            }
        }
        Ok(data)
    }

    /// Writes `bytes` (padded with zeros to whole clusters) to newly allocated metadata
    /// clusters; the guard frees them unless made persistent.
    async fn write_new_clusters(&self, bytes: &[u8]) -> io::Result<(u64, PendingClusters)> {
        let cb = self.header.cluster_bits();
        let count = ClusterCount::from_byte_size(bytes.len() as u64, cb);
        let pending = self.allocate_meta_clusters(count).await?;
        let offset = pending.cluster().offset(cb).0;
        let mut buf = bytes.to_vec();
        buf.resize(count.byte_size(cb) as usize, 0);
        self.metadata.write(&buf[..], offset).await?;
        Ok((offset, pending))
    }

    /// Frees the table of `entry` and its data clusters (best effort: a table that cannot be
    /// read leaks its data clusters, as `qemu-img check` will say).
    async fn free_bitmap(&self, entry: &BitmapEntry) {
        let cb = self.header.cluster_bits();
        if let Ok(table) = self
            .read_bitmap_table(entry.table_offset, entry.table_size)
            .await
        {
            for e in table {
                let at = HostOffset(e & TABLE_ENTRY_OFFSET);
                if at.0 != 0 {
                    self.clusters_to_free.push(ClustersToFreeEntry::metadata(
                        at.cluster(cb),
                        ClusterCount(1),
                    ));
                }
            }
        }
        let bytes = entry.table_size as u64 * 8;
        self.clusters_to_free.push(ClustersToFreeEntry::metadata(
            HostOffset(entry.table_offset).cluster(cb),
            ClusterCount::from_byte_size(bytes, cb),
        ));
    }

    /// Stores persistent dirty bitmaps: each of `store` written anew (flag `in_use` clear,
    /// `auto` as it says), replacing a bitmap of its name; the bitmaps named in `remove`
    /// dropped; every other bitmap of the directory kept as it is (still `in_use`, if a
    /// writable open marked it so). The replaced directory, tables and data clusters are
    /// freed; the `bitmaps` autoclear bit stays set while there is a bitmap, and the extension
    /// goes when none is left.
    pub async fn store_bitmaps(&self, store: &[BitmapData], remove: &[&str]) -> io::Result<()> {
        self.store_bitmaps_with(store, remove, false).await
    }

    /// [`store_bitmaps()`](Self::store_bitmaps), but every data cluster of the bitmaps of
    /// `store` allocated and written, all-zero ones included (aio-rs: a bitmap kept
    /// consistent on disk while the image is open, whose clusters are then written in place,
    /// [`bitmap_data_clusters()`](Self::bitmap_data_clusters)).
    pub async fn store_bitmaps_preallocated(
        &self,
        store: &[BitmapData],
        remove: &[&str],
    ) -> io::Result<()> {
        self.store_bitmaps_with(store, remove, true).await
    }

    /// The host offsets of the data clusters of the bitmap named `name` (as the directory has
    /// it now), one per entry of its bitmap table; 0 for an entry without a cluster (all
    /// zeros or all ones).
    pub async fn bitmap_data_clusters(&self, name: &str) -> io::Result<Vec<u64>> {
        let entry = self
            .header
            .bitmaps()
            .entries
            .iter()
            .find(|e| e.name == name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("No bitmap {name}")))?;
        let table = self
            .read_bitmap_table(entry.table_offset, entry.table_size)
            .await?;
        Ok(table.into_iter().map(|e| e & TABLE_ENTRY_OFFSET).collect())
    }

    /// Marks the bitmaps named in `names` `in_use` in place (their directory entries'
    /// flags), then syncs: from now on QEMU and `qemu-img` treat them as inconsistent, until
    /// they are stored again. A name the directory does not have is ignored.
    pub async fn mark_bitmaps_in_use(&self, names: &[&str]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::other("No write access"));
        }
        let _store = self.bitmaps_store.lock().await;
        let mut state = self.header.bitmaps().clone();
        bitmaps::mark_in_use(self.metadata.as_ref(), &mut state, Some(names)).await?;
        self.header.bitmaps().entries = state.entries;
        Ok(())
    }

    /// [`store_bitmaps()`](Self::store_bitmaps); `preallocate`: all-zero data clusters
    /// written too.
    async fn store_bitmaps_with(
        &self,
        store: &[BitmapData],
        remove: &[&str],
        preallocate: bool,
    ) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::other("No write access"));
        }
        self.header.require_version(3)?;
        let _store = self.bitmaps_store.lock().await;
        let cs = self.header.cluster_size();
        for b in store {
            if b.name.is_empty() || b.name.len() > bitmaps::MAX_NAME_SIZE {
                return Err(invalid_data(format!(
                    "Bitmap name length must be 1 to {} bytes",
                    bitmaps::MAX_NAME_SIZE
                )));
            }
            if !(bitmaps::MIN_GRANULARITY_BITS..=bitmaps::MAX_GRANULARITY_BITS)
                .contains(&b.granularity_bits)
            {
                return Err(invalid_data(format!(
                    "Bitmap '{}' doesn't satisfy the constraints: granularity 2^{}",
                    b.name, b.granularity_bits
                )));
            }
            let size = self.bitmap_data_size(b.granularity_bits);
            if b.data.len() != size {
                return Err(invalid_data(format!(
                    "Bitmap '{}': {} bytes of data, {size} expected",
                    b.name,
                    b.data.len()
                )));
            }
            if size.div_ceil(cs) as u64 > bitmaps::MAX_TABLE_SIZE
                || (size.div_ceil(cs) * cs) as u64 > bitmaps::MAX_PHYS_SIZE
            {
                return Err(invalid_data(format!("Bitmap '{}' is too big", b.name)));
            }
        }
        let old = self.header.bitmaps().clone();

        // The new directory: kept entries in place, stored ones replacing theirs or appended.
        let mut entries: Vec<BitmapEntry> = Vec::new();
        let mut dropped: Vec<BitmapEntry> = Vec::new();
        let mut pending = Vec::new();
        let mut written: Vec<BitmapEntry> = Vec::new();
        for b in store {
            let mut table = vec![0u64; b.data.len().div_ceil(cs)];
            for (i, chunk) in b.data.chunks(cs).enumerate() {
                if !preallocate && chunk.iter().all(|&x| x == 0) {
                    continue;
                }
                let (at, guard) = self.write_new_clusters(chunk).await?;
                table[i] = at;
                pending.push(guard);
            }
            let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_be_bytes()).collect();
            let (table_offset, guard) = self.write_new_clusters(&bytes).await?;
            pending.push(guard);
            written.push(BitmapEntry {
                name: b.name.clone(),
                granularity_bits: b.granularity_bits,
                in_use: false,
                auto: b.auto,
                table_offset,
                table_size: table.len() as u32,
                raw_name: b.name.as_bytes().to_vec(),
            });
        }
        for e in &old.entries {
            if let Some(new) = written.iter().find(|w| w.raw_name == e.raw_name) {
                entries.push(new.clone());
                dropped.push(e.clone());
            } else if remove.iter().any(|r| r.as_bytes() == e.raw_name) {
                dropped.push(e.clone());
            } else {
                entries.push(e.clone());
            }
        }
        for w in written {
            if !entries.iter().any(|e| e.raw_name == w.raw_name) {
                entries.push(w);
            }
        }
        if entries.len() as u32 > bitmaps::MAX_BITMAPS {
            return Err(io::Error::other("Too many persistent bitmaps"));
        }

        let ext = if entries.is_empty() {
            None
        } else {
            let dir = bitmaps::serialize_directory(&entries);
            if dir.len() as u64 > bitmaps::MAX_DIRECTORY_SIZE {
                return Err(io::Error::other("Bitmap directory is too large"));
            }
            let (dir_offset, guard) = self.write_new_clusters(&dir).await?;
            pending.push(guard);
            Some(Extension {
                count: entries.len() as u32,
                dir_size: dir.len() as u64,
                dir_offset,
            })
        };

        // The new clusters' refcounts and contents durable before the header points to them.
        self.caches.flush_all().await?;
        self.metadata.sync().await?;
        {
            let mut state = self.header.bitmaps();
            state.ext = ext;
            state.entries = entries;
        }
        let committed = async {
            self.header.write_shared(self.metadata.as_ref()).await?;
            self.metadata.sync().await
        }
        .await;
        if let Err(e) = committed {
            // What is on disk now is unknown; keep the old clusters (a leak at worst).
            let mut state = self.header.bitmaps();
            state.ext = old.ext;
            state.entries = old.entries;
            return Err(e);
        }
        for guard in pending {
            guard.make_persistent();
        }

        // Only now the old directory, tables and data go.
        for e in &dropped {
            self.free_bitmap(e).await;
        }
        if let Some(old_ext) = old.ext {
            let cb = self.header.cluster_bits();
            self.clusters_to_free.push(ClustersToFreeEntry::metadata(
                HostOffset(old_ext.dir_offset).cluster(cb),
                ClusterCount::from_byte_size(old_ext.dir_size, cb),
            ));
        }
        self.process_clusters_to_free().await;
        self.caches.flush_all().await?;
        self.metadata.sync().await
    }
}
