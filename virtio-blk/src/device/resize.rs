//! A disk resized while it is served (QEMU's `block_resize`).
//!
//! This module owns changing a [`BlockDevice`]'s size: the image first (a raw file truncated
//! or extended, a qcow2 image's virtual size), the capacity the queues check requests against
//! second when growing, first when shrinking, so a request is never let past the image's end.
//! Telling the driver is the transport's (vhost-user's config-change message, a VMM's
//! configuration interrupt); it reads the new size from [`BlockDevice::config`].
//!
//! * A grown disk reads zeros in its new sectors (a raw file's hole, a qcow2 image's
//!   unallocated clusters; a qcow2 image whose backing file is longer than it was shows the
//!   backing file there, as imago grows it).
//! * Shrinking does not wait for requests already running past the new end: a write taken
//!   before the resize may land after it (and extend a raw file again). Quiesce the driver
//!   first when shrinking a disk in use, as one must for the guest's sake anyway.
//! * A read-only disk, a [window](BlockDevice::window) and a block device asked to grow past
//!   its own size are refused, the disk unchanged.

use std::io::{self, Seek};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use aio_core::engine::FileKind;

use super::{Backing, BlockDevice};
use crate::spec::SECTOR_SIZE;

/// Why a disk was not resized (it keeps its size).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResizeError {
    /// The disk is served read-only.
    #[error("the disk is read-only")]
    ReadOnly,
    /// The new size is zero or not a whole number of sectors.
    #[error("the new size must be a positive multiple of 512 (got {bytes})")]
    BadSize {
        /// The size asked for.
        bytes: u64,
    },
    /// The disk is a window of its image (QEMU's raw `offset=` / `size=`): its size is fixed.
    #[error(
        "the disk is a window of its image ({bytes} bytes from offset {offset}): its size is fixed"
    )]
    Window {
        /// Where the window starts.
        offset: u64,
        /// Its size.
        bytes: u64,
    },
    /// A block device cannot be made larger than it is; grow the device itself first.
    #[error("cannot grow a block device past its own {device_bytes} bytes (asked {bytes})")]
    DeviceTooSmall {
        /// The size asked for.
        bytes: u64,
        /// The device's size.
        device_bytes: u64,
    },
    /// The image could not be resized (or a device's size read).
    #[error("resizing the image: {0}")]
    Io(#[source] io::Error),
}

impl From<ResizeError> for io::Error {
    fn from(e: ResizeError) -> Self {
        let kind = match &e {
            ResizeError::Io(source) => source.kind(),
            ResizeError::ReadOnly => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

impl BlockDevice {
    /// Makes the disk `bytes` long (a whole number of sectors), image and capacity both;
    /// asking for the size it has is a no-op. Blocking: a raw image is one `ftruncate(2)`, a
    /// qcow2 image waits for requests holding it alone and writes its header. The driver is
    /// not told here: its transport reads [`config`](Self::config) again.
    pub fn resize(&self, bytes: u64) -> Result<(), ResizeError> {
        if self.options.read_only {
            return Err(ResizeError::ReadOnly);
        }
        if bytes == 0 || bytes % SECTOR_SIZE != 0 {
            return Err(ResizeError::BadSize { bytes });
        }
        // A disk opened inactive changes its image only once it holds the image's locks.
        self.activate().map_err(|e| ResizeError::Io(e.into()))?;
        let old = self.capacity_sectors() * SECTOR_SIZE;
        if bytes == old {
            return Ok(());
        }
        let growing = bytes > old;
        if !growing {
            // No request is let past the new end from here on.
            self.set_capacity(bytes);
        }
        let resized = self.resize_image(bytes);
        match resized {
            Ok(()) if growing => self.set_capacity(bytes),
            Ok(()) => {}
            Err(_) if !growing => self.set_capacity(old),
            Err(_) => {}
        }
        resized
    }

    fn set_capacity(&self, bytes: u64) {
        self.capacity_sectors
            .store(bytes / SECTOR_SIZE, Ordering::Release);
    }

    /// Resizes what stores the sectors.
    fn resize_image(&self, bytes: u64) -> Result<(), ResizeError> {
        match &self.backing {
            Backing::Null => Ok(()),
            Backing::Raw {
                window: true,
                offset,
                ..
            } => Err(ResizeError::Window {
                offset: *offset,
                bytes: self.capacity_sectors() * SECTOR_SIZE,
            }),
            Backing::Raw { file, .. } => {
                // A duplicate of the fd as a `File`: the image's own fd stays the engine's.
                let dup = std::fs::File::from(
                    file.as_fd().try_clone_to_owned().map_err(ResizeError::Io)?,
                );
                if file.kind() == FileKind::BlockDevice {
                    let device_bytes =
                        (&dup).seek(io::SeekFrom::End(0)).map_err(ResizeError::Io)?;
                    return match bytes <= device_bytes {
                        true => Ok(()),
                        false => Err(ResizeError::DeviceTooSmall {
                            bytes,
                            device_bytes,
                        }),
                    };
                }
                dup.set_len(bytes).map_err(ResizeError::Io)
            }
            #[cfg(feature = "qcow2")]
            Backing::Qcow2(image) => image.resize(bytes).map_err(ResizeError::Io),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DiskOptions;
    use crate::format::ImageFormat;

    fn raw_options() -> DiskOptions {
        DiskOptions {
            format: ImageFormat::Raw,
            ..DiskOptions::default()
        }
    }

    #[test]
    fn a_raw_file_grows_and_shrinks_with_its_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let disk = BlockDevice::open(&path, raw_options()).unwrap();
        let clone = disk.clone();
        disk.resize(4 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
        assert_eq!(clone.capacity_sectors(), (4 << 20) / 512, "clones share it");
        assert_eq!(disk.config().capacity, (4 << 20) / 512);
        assert_eq!(disk.chain_limits().capacity_sectors, (4 << 20) / 512);
        disk.resize(512 << 10).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 512 << 10);
        assert_eq!(disk.capacity_sectors(), 1024);
        // What was kept is still there.
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 7));
    }

    #[test]
    fn refusals_leave_the_disk_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let disk = BlockDevice::open(&path, raw_options()).unwrap();
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
        let ro = BlockDevice::open(
            &path,
            DiskOptions {
                read_only: true,
                // Beside the writable disk above, which does not share write.
                locking: aio_block::lock::LockMode::Off,
                ..raw_options()
            },
        )
        .unwrap();
        assert!(matches!(ro.resize(2 << 20), Err(ResizeError::ReadOnly)));
        let window = BlockDevice::window(
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
        assert_eq!(window.capacity_sectors(), 16);
        assert_eq!(disk.capacity_sectors(), 2048);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    }

    #[test]
    fn the_null_device_takes_any_whole_size() {
        let disk = BlockDevice::null(1 << 20, DiskOptions::default()).unwrap();
        disk.resize(1 << 40).unwrap();
        assert_eq!(disk.capacity_sectors(), (1u64 << 40) / 512);
    }
}
