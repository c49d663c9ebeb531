//! The mapping cache of a qcow2 image's direct path: guest cluster -> host offset, for the
//! clusters imago said may be written in place.
//!
//! This module owns [`MappingCache`] and its rules (what is cached, what clears it, see
//! `direct.rs`); it never reads metadata nor submits a request.
//!
//! * **The slots outlive an opening; the file does not.** The table of slots is the image's
//!   for as long as it is served; the file the cached clusters are in ([`DataFile`]) belongs
//!   to one opening of the image by imago, and an image opened again (activated after being
//!   inactive, `reopen.rs`) clears every slot before its new opening is seen.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use aio_core::engine::IoFile;

use super::settle::WriteCounter;
use super::storage::EngineStorage;

/// The most entries a cache keeps (8 bytes each: 32 MiB, QEMU's default limit for its L2
/// cache, whose entries these copy): 256 GiB of disk at 64 KiB clusters. A disk with more
/// clusters shares slots (the last cluster looked up in a slot keeps it).
const MAX_ENTRIES: u64 = 1 << 22;

/// The smallest table worth [`MappingCache::prefetch`]: 1 MiB of slots.
const PREFETCH_FROM: usize = 1 << 17;

/// The most clusters one direct request may span.
const MAX_SPAN: u64 = 8;

/// Guest cluster -> host offset for the clusters of one image that may be written in place: a
/// direct-mapped table (a cluster's slot is its number modulo the table's size), each slot one
/// atomic word: the rest of the cluster's number plus one (0: empty) in the high half, the
/// host cluster's number in the low half. A cluster whose numbers do not fit (a host file
/// past 2^32 clusters) is not cached.
pub(crate) struct MappingCache {
    cluster_bits: u32,
    /// log2 of the number of slots.
    slot_bits: u32,
    slots: Box<[AtomicU64]>,
    /// Bumped by every change that clears entries (see the module's rules).
    generation: AtomicU64,
}

/// The file the cached clusters of one opening are in (the image file, or its external data
/// file), and the count of its writes in flight: set by the first insert.
#[derive(Default)]
pub(crate) struct DataFile(OnceLock<(IoFile, WriteCounter)>);

impl MappingCache {
    /// A cache for an image of `size` bytes in clusters of `1 << cluster_bits` bytes.
    pub(crate) fn new(cluster_bits: u32, size: u64) -> Self {
        let clusters = size.div_ceil(1 << cluster_bits).clamp(1, MAX_ENTRIES);
        let entries = clusters.next_power_of_two();
        MappingCache {
            cluster_bits,
            slot_bits: entries.trailing_zeros(),
            slots: (0..entries).map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU64::new(0),
        }
    }

    /// The bytes from `offset` to the end of the region one L2 table maps (a cluster's worth
    /// of 8-byte entries): how far a lookup for the cache looks.
    pub(crate) fn run_from(&self, offset: u64) -> u64 {
        let table_bits = 2 * self.cluster_bits - 3;
        let end = ((offset >> table_bits) + 1) << table_bits;
        end - offset
    }

    /// The generation to pass to [`insert`](Self::insert), read before the lookup whose
    /// result is inserted.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Guest `cluster`'s slot, and the tag its entry carries there.
    fn slot(&self, cluster: u64) -> (&AtomicU64, u64) {
        let index = (cluster & ((1 << self.slot_bits) - 1)) as usize;
        (&self.slots[index], (cluster >> self.slot_bits) + 1)
    }

    /// Reads the slots of `offsets`' clusters one after the other, so that on a table too
    /// large for the CPU's caches their misses overlap, instead of each stalling the request
    /// that looks its slot up (a batch's requests are looked up one at a time, between other
    /// work). Nothing for a table that fits in the caches.
    pub(crate) fn prefetch(&self, offsets: impl Iterator<Item = u64>) {
        if self.slots.len() < PREFETCH_FROM {
            return;
        }
        let touched = offsets.fold(0u64, |sum, offset| {
            let (slot, _) = self.slot(offset >> self.cluster_bits);
            sum.wrapping_add(slot.load(Ordering::Relaxed))
        });
        std::hint::black_box(touched);
    }

    /// The data file and the host offset of `[offset, offset + len)` if every cluster of it is
    /// cached and they lie in a row in the file (`data_file`, the current opening's).
    pub(crate) fn lookup<'d>(
        &self,
        data_file: &'d DataFile,
        offset: u64,
        len: u64,
    ) -> Option<(&'d (IoFile, WriteCounter), u64)> {
        let file = data_file.0.get()?;
        let first = offset >> self.cluster_bits;
        let last = (offset + len.max(1) - 1) >> self.cluster_bits;
        if last - first >= MAX_SPAN {
            return None;
        }
        let mut first_host = None;
        for (i, cluster) in (first..=last).enumerate() {
            let (slot, tag) = self.slot(cluster);
            let entry = slot.load(Ordering::Acquire);
            if entry >> 32 != tag {
                return None;
            }
            let host_cluster = (entry & u64::from(u32::MAX)).wrapping_sub(i as u64);
            if *first_host.get_or_insert(host_cluster) != host_cluster {
                return None;
            }
        }
        let in_cluster = offset & ((1 << self.cluster_bits) - 1);
        Some((file, (first_host? << self.cluster_bits) + in_cluster))
    }

    /// Records that `[offset, offset + len)` lies in a row at `host` in `storage`, as imago
    /// said of a writable mapping looked up after [`generation`](Self::generation) gave
    /// `generation`; nothing if something has cleared entries since, or if `storage` is not
    /// the current opening's `data_file`.
    pub(crate) fn insert(
        &self,
        data_file: &DataFile,
        generation: u64,
        storage: &EngineStorage,
        offset: u64,
        host: u64,
        len: u64,
    ) {
        // An RBD image has no direct path: nothing is cached.
        let (Some(file), Some(counter)) = (storage.io_file(), storage.write_counter()) else {
            return;
        };
        let (data_file, _) = data_file.0.get_or_init(|| (file.clone(), counter));
        let mask = (1u64 << self.cluster_bits) - 1;
        if data_file.raw_fd() != file.raw_fd() || len == 0 || (host & mask) != (offset & mask) {
            return;
        }
        let first = offset >> self.cluster_bits;
        let last = (offset + len - 1) >> self.cluster_bits;
        let first_host = host >> self.cluster_bits;
        for (i, cluster) in (first..=last).enumerate() {
            let (slot, tag) = self.slot(cluster);
            let host_cluster = first_host + i as u64;
            if tag > u64::from(u32::MAX) || host_cluster > u64::from(u32::MAX) {
                return;
            }
            let entry = (tag << 32) | host_cluster;
            slot.store(entry, Ordering::SeqCst);
            // A clear since the lookup began: its result may be stale. Taken back unless the
            // slot has changed again (a clear bumps the generation before it empties slots,
            // so one that missed this entry is seen here).
            if self.generation.load(Ordering::SeqCst) != generation {
                let _ = slot.compare_exchange(entry, 0, Ordering::SeqCst, Ordering::SeqCst);
                return;
            }
        }
    }

    /// Forgets the clusters of `[offset, offset + len)` (all of them if `len` is `u64::MAX`).
    pub(crate) fn clear(&self, offset: u64, len: u64) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        let first = offset >> self.cluster_bits;
        let last = offset.saturating_add(len.max(1) - 1) >> self.cluster_bits;
        if last - first >= self.slots.len() as u64 {
            for slot in self.slots.iter() {
                slot.store(0, Ordering::SeqCst);
            }
            return;
        }
        for cluster in first..=last {
            let (slot, tag) = self.slot(cluster);
            let entry = slot.load(Ordering::SeqCst);
            if entry >> 32 == tag {
                let _ = slot.compare_exchange(entry, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storage over a new temporary file.
    fn file() -> EngineStorage {
        let f = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        let storage = EngineStorage::open_path(f.path(), false).unwrap();
        drop(f);
        storage
    }

    #[test]
    fn a_request_is_found_only_if_all_its_clusters_are_cached_in_a_row() {
        let cache = MappingCache::new(16, 1 << 30);
        let (f, d) = (file(), DataFile::default());
        assert!(cache.lookup(&d, 0, 4096).is_none(), "empty");
        let g = cache.generation();
        // Guest clusters 2 and 3 at host clusters 10 and 11, cluster 4 at 20.
        cache.insert(&d, g, &f, 2 << 16, 10 << 16, 2 << 16);
        cache.insert(&d, g, &f, (4 << 16) + 512, (20 << 16) + 512, 4096);
        assert_eq!(
            cache.lookup(&d, (2 << 16) + 4096, 4096).unwrap().1,
            (10 << 16) + 4096
        );
        assert_eq!(
            cache.lookup(&d, (3 << 16) - 512, 1024).unwrap().1,
            (11 << 16) - 512
        );
        assert!(
            cache.lookup(&d, (4 << 16) - 512, 1024).is_none(),
            "not in a row"
        );
        assert_eq!(cache.lookup(&d, 4 << 16, 65536).unwrap().1, 20 << 16);
        assert!(cache.lookup(&d, 5 << 16, 4096).is_none(), "not cached");
        // One L2 table of 64 KiB clusters maps 512 MiB.
        assert_eq!(cache.run_from(0), 512 << 20);
        assert_eq!(cache.run_from((512 << 20) + 4096), (512 << 20) - 4096);
    }

    #[test]
    fn clearing_forgets_the_range_and_a_lookup_from_before_is_not_inserted() {
        let cache = MappingCache::new(16, 1 << 30);
        let (f, d) = (file(), DataFile::default());
        let g = cache.generation();
        cache.insert(&d, g, &f, 0, 1 << 20, 4 << 16);
        cache.clear(1 << 16, 4096);
        assert!(cache.lookup(&d, 1 << 16, 4096).is_none(), "cleared");
        assert!(cache.lookup(&d, 0, 4096).is_some(), "left alone");
        // A lookup made before the clear: its result is stale.
        cache.insert(&d, g, &f, 1 << 16, (1 << 20) + (1 << 16), 4096);
        assert!(
            cache.lookup(&d, 1 << 16, 4096).is_none(),
            "a stale insert is dropped"
        );
        cache.clear(0, u64::MAX);
        assert!(cache.lookup(&d, 0, 4096).is_none(), "all cleared");
        let g = cache.generation();
        cache.insert(&d, g, &f, 1 << 16, 1 << 20, 4096);
        assert!(
            cache.lookup(&d, 1 << 16, 4096).is_some(),
            "a fresh insert is kept"
        );
    }

    #[test]
    fn clusters_sharing_a_slot_replace_each_other_and_another_file_is_not_cached() {
        // A 64 KiB disk of 4 KiB clusters: 16 slots.
        let cache = MappingCache::new(12, 64 << 10);
        let (f, d) = (file(), DataFile::default());
        let g = cache.generation();
        cache.insert(&d, g, &f, 0, 1 << 20, 4096);
        cache.insert(&d, g, &f, 16 << 12, 2 << 20, 4096);
        assert!(cache.lookup(&d, 0, 4096).is_none(), "replaced");
        assert_eq!(cache.lookup(&d, 16 << 12, 4096).unwrap().1, 2 << 20);
        cache.insert(&d, g, &file(), 1 << 12, 3 << 20, 4096);
        assert!(cache.lookup(&d, 1 << 12, 4096).is_none(), "another file");
    }
}
