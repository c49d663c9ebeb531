//! A qcow2 image made inactive and active again: its metadata written back and its locks let
//! go, then its locks taken and its metadata read afresh (QEMU's `qcow2_inactivate` and
//! `qcow2_co_invalidate_cache`).
//!
//! This module owns the two transitions of a [`Qcow2Image`] and where the image is opened
//! again from ([`Source`]); when they happen is the image's (`image/handoff.rs`).
//!
//! * **Swapped under the image's lock.** Every request holds the image's lock (shared) from
//!   its start to its end, the direct path's until the kernel is done. A transition takes it
//!   alone, without waiting (requests still holding it are the caller's: refused as
//!   [`ActivationError::InFlight`], nothing changed), and replaces the opening there; the
//!   mapping cache is cleared before the lock is let go. A request pays nothing for it.
//! * **Inactive is read-only, unlocked, and writes nothing.** Inactivating writes imago's
//!   cached L2 tables and refcount blocks back, syncs, and opens the image again read-only
//!   (every cache dropped; a drop writes nothing from here on); then the locks go. Reads are
//!   served from the metadata read then, stale once the other process changes it, as QEMU
//!   allows.
//! * **Active reads afresh.** Activating takes the image's lock first (a conflict leaves
//!   everything as it was), then opens the image anew: what another process wrote meanwhile
//!   is seen.
//! * **The persistent bitmaps go with the image**, as QEMU hands them over: inactivating
//!   stores them (every write's bit is in memory: nothing is in flight), consistent, before
//!   the write-back, and the image's set lets them go (`Image::inactivate`); activating opens
//!   the image anew and loads them as the last user stored them, kept consistent on disk
//!   from then on through the new opening's descriptor (`durable.rs`).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use imago::qcow2::Qcow2;

use super::source::Source;
use super::storage::EngineStorage;
use super::{current, Opening, Qcow2Image};
use crate::bitmap::BitmapSet;
use crate::image::error::{ActivationError, OpenError};
use crate::image::ImageOptions;
use crate::lock::{Access, ImageLock, LockError, LockMode};

impl Qcow2Image {
    /// Writes the metadata back, syncs, opens the image again read-only (its caches dropped)
    /// and lets its locks go. Refused with [`ActivationError::InFlight`] while a request holds
    /// the image; the image stays as it was if writing back or opening fails.
    pub(crate) fn inactivate(&self, bitmaps: &BitmapSet) -> Result<(), ActivationError> {
        let Ok(mut access) = self.access.try_write() else {
            return Err(self.in_flight());
        };
        // Nothing in flight: every write's bit is in memory. The persistent bitmaps are
        // stored as they are (QEMU's `qcow2_inactivate`), for the next user to load.
        let writable = self.writable.load(Ordering::Acquire);
        self.durable.release_all();
        current::block_on(async {
            if writable {
                if let Some(qcow2) = access.downcast_ref::<Qcow2<EngineStorage>>() {
                    if let Err(e) = super::bitmaps::store_set(qcow2, bitmaps).await {
                        // No longer kept on disk: in use, or a crash would leave them
                        // missing writes (best effort: the store's error is the one told).
                        let dir = qcow2.bitmap_directory();
                        let names: Vec<&str> = dir.iter().map(|b| b.name.as_str()).collect();
                        let _ = qcow2.mark_bitmaps_in_use(&names).await;
                        return Err(e);
                    }
                }
            }
            access.flush().await?;
            access.sync().await
        })
        .map_err(|source| ActivationError::Flush {
            path: self.path.clone(),
            source,
        })?;
        let fresh = self.open_again(false, LockMode::Off)?;
        self.durable.reopened(fresh.file.clone());
        // The old opening (and its writable files) goes here, before the locks.
        *access = fresh.opened;
        self.cache.clear(0, u64::MAX);
        self.writable.store(false, Ordering::Release);
        drop(access);
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        #[cfg(feature = "rbd")]
        if let Source::Rbd { image, .. } = &self.source {
            image.release_lock()?;
        }
        Ok(())
    }

    /// Takes the locks `options` ask for (the image's first, then its backing files' as they
    /// are opened) and opens the image anew, writable unless read-only; returns its size now.
    /// A conflict, a refused header (a dirty image asked for writes) or a backing chain that
    /// changed leaves the image inactive, as it was.
    pub(crate) fn activate(&self, options: &ImageOptions) -> Result<u64, ActivationError> {
        let writable = !options.read_only;
        let Ok(mut access) = self.access.try_write() else {
            return Err(self.in_flight());
        };
        let (mut locks, mode) = self.lock_own(writable, options.locking)?;
        let fresh = match self.open_again(writable, mode) {
            Ok(fresh) if fresh.chain == self.chain => fresh,
            refused => {
                self.release_own();
                return Err(match refused {
                    Err(e) => e.into(),
                    Ok(_) => ActivationError::ChainChanged {
                        path: self.path.clone(),
                    },
                });
            }
        };
        locks.extend(fresh.locks);
        self.durable.release_all();
        self.durable.reopened(fresh.file.clone());
        *access = fresh.opened;
        self.cache.clear(0, u64::MAX);
        (self.bitmaps_marked_inconsistent.lock())
            .unwrap_or_else(PoisonError::into_inner)
            .extend(fresh.bitmaps);
        self.writable.store(writable, Ordering::Release);
        *self.locks.lock().unwrap_or_else(PoisonError::into_inner) = locks;
        Ok(access.size())
    }

    fn in_flight(&self) -> ActivationError {
        ActivationError::InFlight {
            path: self.path.clone(),
        }
    }

    /// The image's own lock, as opening takes it (a file's lock bytes, an RBD image's
    /// exclusive lock for a writer), and how its backing files are to be locked.
    fn lock_own(
        &self,
        writable: bool,
        mode: LockMode,
    ) -> Result<(Vec<ImageLock>, LockMode), ActivationError> {
        match &self.source {
            Source::File => {
                let file = std::fs::File::open(&self.path).map_err(|source| LockError::Io {
                    path: self.path.clone(),
                    source,
                })?;
                let lock =
                    ImageLock::acquire(&file, &self.path, Access::qcow2_file(writable), mode)?;
                let backing = match lock.is_locked() {
                    true => LockMode::Auto,
                    false => LockMode::Off,
                };
                Ok((vec![lock], backing))
            }
            #[cfg(feature = "rbd")]
            Source::Rbd { image, records } => {
                if writable && mode != LockMode::Off {
                    image.lock_exclusive(records.as_ref())?;
                }
                // What librbd cached for the inactive opening may be stale.
                if let Err(e) = image.invalidate_cache() {
                    let _ = image.release_lock();
                    return Err(e.into());
                }
                Ok((vec![], LockMode::Off))
            }
        }
    }

    /// Lets go of what [`lock_own`](Self::lock_own) took in an RBD image (a file's locks go
    /// with their values).
    fn release_own(&self) {
        #[cfg(feature = "rbd")]
        if let Source::Rbd { image, .. } = &self.source {
            let _ = image.release_lock();
        }
    }

    /// The image opened again from its source (for writing when `writable`, its backing files
    /// locked as `mode` says), its cluster size unchanged.
    fn open_again(&self, writable: bool, mode: LockMode) -> Result<Opening, OpenError> {
        let (head, opening) = match &self.source {
            Source::File => {
                let open_backing = self.node_backing.opens_backing();
                Self::open_file(&self.path, writable, mode, open_backing)?
            }
            #[cfg(feature = "rbd")]
            Source::Rbd { image, .. } => Self::open_rbd_format(&self.path, image, writable)?,
        };
        if super::cluster_bits(&head) != self.cluster_bits {
            return Err(OpenError::FormatNotServed {
                path: self.path.clone(),
                reason: "its cluster size changed while it was inactive: open it again",
            });
        }
        Ok(opening)
    }
}
