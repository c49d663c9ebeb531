//! An image opened before its other user has let it go: an upgrade, where a new daemon takes
//! over a socket while the old one still serves its last frontend.
//!
//! This module owns the inactive open and the activation that takes the image's locks later,
//! as QEMU opens an incoming migration's images inactive (no locks) and takes their locks
//! when the source has given them up; it never serves a request.
//!
//! * **Raw images only.** A raw image has nothing cached from the file: the old daemon's
//!   writes until it stops are read by the new one as they are. A qcow2 image is refused
//!   ([`OpenError::NotInactive`]): its metadata read now would be stale once the old daemon
//!   has allocated more (QEMU re-reads it on activation; this crate does not yet).
//! * **No request before activation.** The export calls [`Image::activate`] before it takes
//!   a client's requests; until then the image holds no lock and reads nothing but its
//!   header, and a request given to it anyway is refused (`EAGAIN`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

use super::error::OpenError;
use super::{Image, ImageOptions, PendingLocks};
use crate::lock::{Access, ImageLock, LockError, LockMode};

impl Image {
    /// Opens a raw image at `path` as [`open`](Self::open) does, but takes no lock yet:
    /// another process (the daemon this one succeeds) may still use it.
    /// [`activate`](Self::activate) takes the locks the options ask for, once that process
    /// has let them go. A qcow2 image is refused with [`OpenError::NotInactive`].
    pub fn open_inactive(path: &Path, options: ImageOptions) -> Result<Self, OpenError> {
        let unlocked = options.clone().locking(LockMode::Off);
        let mut image = Self::open_as(path, unlocked, false)?;
        image.pending = Some(PendingLocks {
            path: path.to_path_buf(),
            access: Access::disk(!options.read_only, options.share_rw),
            mode: options.locking,
            held: Mutex::new(None),
        });
        image.options = options;
        image.active.store(false, Ordering::Release);
        Ok(image)
    }

    /// Takes the locks of an image opened [inactive](Self::open_inactive) (nothing to do for
    /// any other image, or once taken): another process's conflicting use is
    /// [`LockError::Conflict`], and the image stays inactive.
    pub fn activate(&self) -> Result<(), LockError> {
        let Some(pending) = &self.pending else {
            return Ok(());
        };
        let mut held = pending.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_some() {
            return Ok(());
        }
        let file = std::fs::File::open(&pending.path).map_err(|source| LockError::Io {
            path: pending.path.clone(),
            source,
        })?;
        *held = Some(ImageLock::acquire(
            &file,
            &pending.path,
            pending.access,
            pending.mode,
        )?);
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// [`activate`](Self::activate), tried again every 20 ms while another process holds a
    /// conflicting lock, until `wait` has passed (the old daemon of an upgrade draining).
    pub fn activate_within(&self, wait: std::time::Duration) -> Result<(), LockError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match self.activate() {
                Err(LockError::Conflict { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                result => return result,
            }
        }
    }

    /// Whether the image may serve requests: false only for an
    /// [inactive](Self::open_inactive) image not yet [activated](Self::activate).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ImageFormat;

    fn raw() -> ImageOptions {
        ImageOptions::new(ImageFormat::Raw)
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
        assert!(matches!(new.activate(), Err(LockError::Conflict { .. })));
        assert!(!new.is_active());
        drop(old);
        new.activate().unwrap();
        assert!(new.is_active());
        // Its lock is held now: a third writer is refused.
        assert!(Image::open(&path, raw()).is_err());
    }

    #[test]
    fn a_qcow2_image_is_not_opened_inactive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.qcow2");
        let mut head = vec![0u8; 1 << 16];
        head[..4].copy_from_slice(b"QFI\xfb");
        head[7] = 3;
        std::fs::write(&path, head).unwrap();
        let e = Image::open_inactive(&path, ImageOptions::default()).unwrap_err();
        assert!(matches!(e, OpenError::NotInactive { .. }), "{e}");
    }
}
