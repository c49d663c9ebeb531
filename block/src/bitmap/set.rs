//! An image's dirty bitmaps: added, found, removed by name, and dirtied together by the
//! request filter.
//!
//! This module owns the set (one per [`Image`](crate::Image), shared by every queue serving
//! it) and the rule of which bitmaps a completed write dirties (the recording ones); never
//! the bits themselves (`mod.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::{check_granularity, BitmapError, DirtyBitmap};

/// How [`Image::add_dirty_bitmap`](crate::Image::add_dirty_bitmap) makes a bitmap (`block-dirty-bitmap-add`'s optional arguments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BitmapOptions {
    /// Its granularity in bytes (None: the image's default, [`super::default_granularity`]).
    pub granularity: Option<u32>,
    /// Kept in the image (qcow2 only).
    pub persistent: bool,
    /// Created disabled (not recording).
    pub disabled: bool,
}

impl BitmapOptions {
    /// The defaults: the image's granularity, not persistent, recording.
    pub fn new() -> Self {
        Self::default()
    }

    /// With this granularity.
    pub fn granularity(mut self, granularity: u32) -> Self {
        self.granularity = Some(granularity);
        self
    }

    /// Persistent or not.
    pub fn persistent(mut self, persistent: bool) -> Self {
        self.persistent = persistent;
        self
    }

    /// Created disabled or not.
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.disabled = disabled;
        self
    }
}

/// An image's dirty bitmaps. `Send + Sync`.
#[derive(Debug, Default)]
pub struct BitmapSet {
    bitmaps: RwLock<Vec<Arc<DirtyBitmap>>>,
    /// How many there are: the request filter's check, without the lock, that there is
    /// nothing to dirty.
    len: AtomicUsize,
}

impl BitmapSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<DirtyBitmap>>> {
        self.bitmaps.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<DirtyBitmap>>> {
        self.bitmaps.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether there is none (no lock taken).
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    /// The bitmap named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<DirtyBitmap>> {
        self.read().iter().find(|b| b.name() == name).cloned()
    }

    /// The bitmap named `name`, or QEMU's "not found".
    pub fn find(&self, name: &str) -> Result<Arc<DirtyBitmap>, BitmapError> {
        self.get(name)
            .ok_or_else(|| BitmapError::NotFound(name.to_string()))
    }

    /// Every bitmap, in the order they were added.
    pub fn list(&self) -> Vec<Arc<DirtyBitmap>> {
        self.read().clone()
    }

    /// Makes a new bitmap named `name` over `size` bytes, `default_granularity` unless the
    /// options give one, without adding it (a transaction's staged `block-dirty-bitmap-add`);
    /// `storable` says whether the image can keep a persistent one (its error names `node`).
    /// Whether the name is taken is [`insert`](Self::insert)'s check.
    pub(crate) fn make(
        name: &str,
        (size, default_granularity): (u64, u32),
        options: BitmapOptions,
        (storable, node): (bool, &str),
    ) -> Result<Arc<DirtyBitmap>, BitmapError> {
        if name.is_empty() {
            return Err(BitmapError::EmptyName);
        }
        if let Some(g) = options.granularity {
            check_granularity(g)?;
        }
        if options.persistent && !storable {
            return Err(BitmapError::NotStorable {
                node: node.to_string(),
            });
        }
        let granularity = options.granularity.unwrap_or(default_granularity);
        let bitmap = DirtyBitmap::new(name, size, granularity)?;
        bitmap.set_persistent(options.persistent);
        if options.disabled {
            bitmap.recording.store(false, Ordering::Release);
        }
        Ok(Arc::new(bitmap))
    }

    /// Adds `bitmap` (one loaded from the image, or made by the caller); refused when a
    /// bitmap of its name exists.
    pub fn insert(&self, bitmap: Arc<DirtyBitmap>) -> Result<(), BitmapError> {
        let mut all = self.write();
        if all.iter().any(|b| b.name() == bitmap.name()) {
            return Err(BitmapError::Exists(bitmap.name().to_string()));
        }
        all.push(bitmap);
        self.len.store(all.len(), Ordering::Release);
        Ok(())
    }

    /// Removes the bitmap named `name` (`block-dirty-bitmap-remove`): refused while it is
    /// busy or read-only, as QEMU refuses it; an inconsistent one may be removed (that is
    /// what QEMU's hint says to do with it).
    pub fn remove(&self, name: &str) -> Result<Arc<DirtyBitmap>, BitmapError> {
        let mut all = self.write();
        let at = all
            .iter()
            .position(|b| b.name() == name)
            .ok_or_else(|| BitmapError::NotFound(name.to_string()))?;
        all[at].check_removable()?;
        let removed = all.remove(at);
        self.len.store(all.len(), Ordering::Release);
        Ok(removed)
    }

    /// Drops every persistent bitmap from the set, busy or not (QEMU's
    /// `bdrv_release_persistent_dirty_bitmaps`): an image inactivated has stored them for the
    /// next user, who may change them; its activation loads them again. Returns how many.
    pub(crate) fn release_persistent(&self) -> usize {
        let mut all = self.write();
        let before = all.len();
        all.retain(|b| !b.is_persistent());
        self.len.store(all.len(), Ordering::Release);
        before - all.len()
    }

    /// Dirties `[offset, offset + len)` in every recording bitmap: what a write, write-zeroes
    /// or discard does when it completes (failed or not, as QEMU's
    /// `bdrv_co_write_req_finish`).
    pub(crate) fn mark(&self, offset: u64, len: u64) {
        if self.is_empty() {
            return;
        }
        for bitmap in self.read().iter() {
            if bitmap.is_recording() {
                bitmap.set(offset, len);
            }
        }
    }

    /// Grows or shrinks every bitmap with the image.
    pub(crate) fn resize(&self, size: u64) {
        for bitmap in self.read().iter() {
            bitmap.resize(size);
        }
    }
}
