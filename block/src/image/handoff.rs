//! An image's inactive state and its transitions, with QEMU 10.0's semantics: an image one
//! process serves while another owns it (live migration's handover, `blockdev-set-active`; a
//! new daemon taking over a socket in an upgrade).
//!
//! This module owns the inactive state and the two transitions, [`Image::inactivate`] and
//! [`Image::activate`], and opening an image inactive; it never serves a request (the queue
//! refuses, `queue.rs`), and what each kind does on a transition is its driver's.
//!
//! * **Inactive: reads only, no lock, nothing written.** An inactive image holds none of its
//!   locks (QEMU's lock bytes on files and devices, a qcow2 image's backing files', an RBD
//!   image's exclusive lock) and writes nothing, not even metadata. Reads are served, from
//!   the metadata last read (stale once the owner changes it: QEMU allows that); every other
//!   request (write, write-zeroes, discard, flush) is refused with `EPERM`, as QEMU's NBD
//!   server answers "export is inactive", and a resize with [`ResizeError::Inactive`].
//! * **Inactivate** (the caller has drained the image's requests: its contract; a qcow2
//!   image checks it, [`ActivationError::InFlight`]): refuses all but reads from then on,
//!   writes back and syncs what the image caches (a qcow2 image's L2 tables and refcount
//!   blocks), drops every cache, and lets every lock go. Idempotent. On an error the image is
//!   active again, its locks held.
//! * **Activate**: takes the locks the options ask for (a conflict is
//!   [`LockError::Conflict`] inside [`ActivationError::Lock`], and the image stays inactive
//!   and readable), reads the metadata afresh (a qcow2 image opened anew, so what the other
//!   process wrote is seen; a file's size read again), then lets every request run.
//!   Idempotent.
//! * **Opened inactive** ([`Image::open_inactive`]): every kind (raw files and devices,
//!   qcow2 opened read-only by imago, RBD without its exclusive lock, null), its header
//!   probed (4 KiB, which no lock forbids) and nothing written.
//! * **The request path pays one load.** A request that is not a read loads the active flag
//!   (one atomic load, as before); a qcow2 image's opening is swapped under the lock every
//!   request already holds.
//!
//! [`ResizeError::Inactive`]: super::ResizeError::Inactive
//! [`LockError::Conflict`]: crate::lock::LockError::Conflict

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};

use super::driver::Driver;
use super::error::{ActivationError, OpenError};
use super::{check_size, dispatch, Image, ImageOptions};

impl Image {
    /// Opens the image at `path` as [`open`](Self::open) does, but inactive: no lock is taken
    /// and nothing is written (a qcow2 image is opened read-only by imago, its backing files
    /// unlocked), for another process (the migration's source, the daemon this one succeeds)
    /// may still own it. Reads are served from the metadata read now; everything else waits
    /// for [`activate`](Self::activate), which takes the locks the options ask for. Every kind
    /// of file opens so ([`OpenError::NotInactive`] is never returned).
    pub fn open_inactive(path: &Path, options: ImageOptions) -> Result<Self, OpenError> {
        let image = Self::open_as(path, options, true)?;
        image.active.store(false, Ordering::Release);
        Ok(image)
    }

    /// Makes the image inactive (QEMU's `bdrv_inactivate`): from here on only reads are
    /// served; what it caches is written back and synced (a qcow2 image's metadata), every
    /// cache dropped, and every lock let go, for another process to take the image over.
    /// A writable qcow2 image's persistent dirty bitmaps are stored first and leave the
    /// image's set (QEMU's rule: the next user owns them); [`activate`](Self::activate) loads
    /// them again. Nothing to do if inactive already.
    ///
    /// The caller has drained the image: no request of any export is in flight (a qcow2
    /// image refuses with [`ActivationError::InFlight`] while one holds it). Blocking (a sync,
    /// a qcow2 image's write-back and reopening): call it from a thread that serves none of
    /// the image's queues, or with them stopped. On an error the image stays active, its locks
    /// held.
    pub fn inactivate(&self) -> Result<(), ActivationError> {
        let _one = self.steady();
        if !self.is_active() {
            return Ok(());
        }
        // Nothing but reads from here on: no write can land after the write-back.
        self.active.store(false, Ordering::Release);
        let done = dispatch!(&self.backing, d => d.inactivate(&self.path, &self.bitmaps));
        match done {
            // Stored (a writable qcow2 image): the next user owns them now.
            Ok(()) => {
                self.bitmaps.release_persistent();
            }
            Err(_) => self.active.store(true, Ordering::Release),
        }
        done
    }

    /// Makes an inactive image active (QEMU's `bdrv_activate`): takes the locks the options
    /// ask for, reads the metadata afresh (a qcow2 image opened anew, writable unless
    /// read-only; a file's size read again), then lets every request run. Nothing to do if
    /// active already.
    ///
    /// Another process's conflicting use is [`ActivationError::Lock`] (a
    /// [`LockError::Conflict`](crate::lock::LockError::Conflict), whose `qemu_desc()` is
    /// QEMU's text; an RBD image's is [`ActivationError::Rbd`]), and the image stays inactive
    /// and readable. Blocking; a qcow2 image's reads in flight are
    /// [`ActivationError::InFlight`] (drain the image first, as QEMU activates drained).
    pub fn activate(&self) -> Result<(), ActivationError> {
        let _one = self.steady();
        if self.is_active() {
            return Ok(());
        }
        let size = dispatch!(&self.backing, d => d.activate(&self.path, &self.options))?;
        if let Some(bytes) = size {
            let bytes = check_size(&self.path, bytes).map_err(ActivationError::Reopen)?;
            self.size.store(bytes, Ordering::Release);
        }
        // The persistent bitmaps as the last user left them (QEMU loads them at
        // `qcow2_co_invalidate_cache`); a clean close stores them again.
        self.bitmaps.release_persistent();
        self.bitmaps_stored.store(false, Ordering::Release);
        if let Err(e) = self.load_persistent_bitmaps() {
            eprintln!(
                "image {}: its persistent bitmaps could not be loaded: {e}",
                self.path.display()
            );
        }
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// [`activate`](Self::activate), tried again every 20 ms while another process holds a
    /// conflicting lock ([`ActivationError::is_conflict`]), until `wait` has passed (the old
    /// daemon of an upgrade draining).
    pub fn activate_within(&self, wait: std::time::Duration) -> Result<(), ActivationError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match self.activate() {
                Err(e) if e.is_conflict() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                result => return result,
            }
        }
    }

    /// Whether the image serves every request: false while it is inactive
    /// ([opened](Self::open_inactive) so and not yet [activated](Self::activate), or
    /// [inactivated](Self::inactivate)), when only reads are served.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Held while the image changes between active and inactive (or is resized): one at a
    /// time.
    pub(super) fn steady(&self) -> MutexGuard<'_, ()> {
        self.transition
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ImageFormat;
    use crate::lock::LockError;

    fn raw() -> ImageOptions {
        ImageOptions::new(ImageFormat::Raw)
    }

    fn conflict(e: &ActivationError) -> bool {
        matches!(e, ActivationError::Lock(LockError::Conflict { .. }))
    }

    #[test]
    fn an_inactive_disk_takes_its_lock_once_the_other_user_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let old = Image::open(&path, raw()).unwrap();
        assert!(matches!(
            Image::open(&path, raw()),
            Err(OpenError::Lock(LockError::Conflict { .. }))
        ));
        let new = Image::open_inactive(&path, raw()).unwrap();
        assert!(!new.is_active());
        let e = new.activate().unwrap_err();
        assert!(conflict(&e) && e.is_conflict(), "{e}");
        assert_eq!(e.qemu_desc(), "Failed to get \"write\" lock");
        assert!(!new.is_active());
        drop(old);
        new.activate().unwrap();
        assert!(new.is_active());
        // Its lock is held now: a third writer is refused.
        assert!(Image::open(&path, raw()).is_err());
    }

    /// Inactivating lets the lock go (twice is once); the other user takes it; the first
    /// cannot take it back meanwhile, nor resize.
    #[test]
    fn inactivating_hands_the_lock_over_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let a = Image::open(&path, raw()).unwrap();
        let b = Image::open_inactive(&path, raw()).unwrap();
        a.inactivate().unwrap();
        a.inactivate().unwrap();
        assert!(!a.is_active());
        assert!(matches!(
            a.resize(2 << 20),
            Err(super::super::ResizeError::Inactive)
        ));
        b.activate().unwrap();
        b.activate().unwrap();
        assert!(conflict(&a.activate().unwrap_err()));
        assert!(!a.is_active());
        // B grew the file: A, active again once B lets go, sees the new size.
        b.resize(2 << 20).unwrap();
        b.inactivate().unwrap();
        a.activate().unwrap();
        assert_eq!(a.size(), 2 << 20);
    }

    #[test]
    fn the_null_image_goes_inactive_and_back() {
        let null = Image::null(1 << 20, ImageOptions::default()).unwrap();
        null.inactivate().unwrap();
        assert!(!null.is_active());
        null.activate().unwrap();
        assert!(null.is_active());
    }
}
