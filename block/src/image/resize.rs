//! An image resized while it is served (QEMU's `block_resize`).
//!
//! This module owns changing an [`Image`]'s size: what stores it first (a raw file truncated
//! or extended, a qcow2 image's virtual size), the size requests are checked against second
//! when growing, first when shrinking, so a request is never let past the image's end.
//! Telling the client is the export's (vhost-user's config-change message, a VMM's
//! configuration interrupt); it reads the new size from [`Image::size`].
//!
//! * A grown image reads zeros in its new sectors (a raw file's hole, a qcow2 image's
//!   unallocated clusters; a qcow2 image whose backing file is longer than it was shows the
//!   backing file there, as imago grows it).
//! * Shrinking does not wait for requests already running past the new end: a write taken
//!   before the resize may land after it (and extend a raw file again). Quiesce the client
//!   first when shrinking an image in use, as one must for the guest's sake anyway.
//! * A read-only image, an [inactive](Image::inactivate) one, a [window](Image::window) and
//!   a block device asked to grow past its own size are refused, the image unchanged.

use std::sync::atomic::Ordering;

use super::driver::Driver;
use super::error::ResizeError;
use super::{dispatch, Image, SECTOR_SIZE};

impl Image {
    /// Makes the image `bytes` long (a whole number of sectors), what stores it and the size
    /// its users see both; asking for the size it has is a no-op. Blocking: a raw image is
    /// one `ftruncate(2)`, a qcow2 image waits for requests holding it alone and writes its
    /// header. Its exports are not told here: each reads [`size`](Self::size) again (a
    /// virtio-blk device's config space, vhost-user's config-change message).
    pub fn resize(&self, bytes: u64) -> Result<(), ResizeError> {
        if self.options.read_only {
            return Err(ResizeError::ReadOnly);
        }
        if bytes == 0 || bytes % SECTOR_SIZE != 0 {
            return Err(ResizeError::BadSize { bytes });
        }
        // Not beside a transition: an inactive image (another process may own it) is not
        // changed.
        let _steady = self.steady();
        if !self.is_active() {
            return Err(ResizeError::Inactive);
        }
        let old = self.size();
        if bytes == old {
            return Ok(());
        }
        let growing = bytes > old;
        if !growing {
            // No request is let past the new end from here on.
            self.size.store(bytes, Ordering::Release);
        }
        let resized = dispatch!(&self.backing, d => d.resize(bytes, old));
        if resized.is_ok() {
            self.bitmaps.resize(bytes);
        }
        match resized {
            Ok(()) if growing => self.size.store(bytes, Ordering::Release),
            Ok(()) => {}
            Err(_) if !growing => self.size.store(old, Ordering::Release),
            Err(_) => {}
        }
        resized
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ImageFormat;
    use crate::image::ImageOptions;
    use crate::lock::LockMode;
    use std::io;

    fn raw_options() -> ImageOptions {
        ImageOptions::new(ImageFormat::Raw)
    }

    #[test]
    fn a_raw_file_grows_and_shrinks_with_its_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let disk = Image::open(&path, raw_options()).unwrap();
        disk.resize(4 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
        assert_eq!(disk.size(), 4 << 20);
        disk.resize(512 << 10).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 512 << 10);
        assert_eq!(disk.size(), 512 << 10);
        // What was kept is still there.
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 7));
    }

    #[test]
    fn refusals_leave_the_disk_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let disk = Image::open(&path, raw_options()).unwrap();
        for bad in [0, 1000, (1 << 20) + 1] {
            let e = disk.resize(bad).unwrap_err();
            assert!(
                matches!(e, ResizeError::BadSize { bytes } if bytes == bad),
                "{e}"
            );
        }
        assert_eq!(
            io::Error::from(disk.resize(0).unwrap_err()).kind(),
            io::ErrorKind::InvalidInput
        );
        let ro = Image::open(
            &path,
            // Beside the writable image above, which does not share write.
            raw_options().read_only(true).locking(LockMode::Off),
        )
        .unwrap();
        assert!(matches!(ro.resize(2 << 20), Err(ResizeError::ReadOnly)));
        let window = Image::window(
            aio_core::engine::IoFile::new(
                std::fs::File::options()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap(),
            ),
            4096,
            8192,
            raw_options(),
        )
        .unwrap();
        let e = window.resize(16384).unwrap_err();
        assert!(
            matches!(
                e,
                ResizeError::Window {
                    offset: 4096,
                    bytes: 8192
                }
            ),
            "{e}"
        );
        assert_eq!(window.size(), 8192);
        assert_eq!(disk.size(), 1 << 20);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    }

    #[test]
    fn the_null_device_takes_any_whole_size() {
        let disk = Image::null(1 << 20, ImageOptions::default()).unwrap();
        disk.resize(1 << 40).unwrap();
        assert_eq!(disk.size(), 1u64 << 40);
    }
}
