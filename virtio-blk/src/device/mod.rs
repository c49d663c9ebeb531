//! The disk behind a virtio-blk device: its image, and what the driver is told of it.
//!
//! This module owns what is virtio's about a disk: the serial `GET_ID` answers, the number of
//! queues, the feature bits and the config space, the limits a chain is checked against. The
//! image itself (opening, formats, locks, size, resize, statistics) is `aio-block`'s
//! [`Image`], which other exports (NBD) may serve at the same time; this module never
//! touches a queue or guest memory.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aio_block::image::{ActivationError, Image, ImageOptions};
use aio_block::lock::LockMode;
use aio_block::stats::BlockStats;
use aio_core::engine::IoFile;

use crate::chain::ChainLimits;
use crate::format::ImageFormat;
use crate::spec::{self, bit, feature, BlkConfig, SECTOR_SIZE};

mod error;
pub use aio_block::image::ResizeError;
pub use error::DeviceError;

/// The largest queue a driver may set up (`SET_VRING_NUM`), as QEMU's virtio-blk.
pub const MAX_QUEUE_SIZE: u16 = 1024;
/// The most data segments in one request: a 128-entry queue less the header and status
/// descriptors (QEMU's `seg-max-adjust`).
pub const SEG_MAX: u32 = 126;
/// The largest data segment (`size_max`).
pub const SIZE_MAX: u32 = 1 << 20;
/// The most sectors one discard or write-zeroes covers (32 MiB).
pub const MAX_RANGE_SECTORS: u32 = 65_536;

/// How to serve one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskOptions {
    /// Refuse writes, discards and write-zeroes (`VIRTIO_BLK_F_RO`).
    pub read_only: bool,
    /// What `GET_ID` answers: at most 20 bytes.
    pub serial: String,
    /// How many queues (`VIRTIO_BLK_F_MQ` when more than one).
    pub queues: u16,
    /// The image's format: [`ImageFormat::Auto`] serves a qcow2 header as qcow2, refuses any
    /// other known format's and serves the rest as raw; [`ImageFormat::Raw`] serves any image
    /// as raw; [`ImageFormat::Qcow2`] only a qcow2 image.
    pub format: ImageFormat,
    /// QEMU's `locking=`: whether the image (and a qcow2 image's backing files) are locked
    /// as QEMU locks them, so that QEMU's tools and other daemons see this disk's use of them
    /// ([`aio_block::lock`]). Default `auto`.
    pub locking: LockMode,
    /// `share-rw=on`: let other users write the image beside this disk (two writers the
    /// operator knows to be safe: a cluster file system). A qcow2 image never shares write,
    /// whatever this says: its metadata is written by one user only.
    pub share_rw: bool,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            read_only: false,
            serial: String::new(),
            queues: 1,
            format: ImageFormat::Auto,
            locking: LockMode::Auto,
            share_rw: false,
        }
    }
}

impl DiskOptions {
    /// The options of the image under the disk.
    pub fn image_options(&self) -> ImageOptions {
        ImageOptions::new(self.format)
            .read_only(self.read_only)
            .locking(self.locking)
            .share_rw(self.share_rw)
    }
}

/// One virtio-blk disk: an [`Image`] (shared with whatever else serves it), and what the
/// driver is told. `Send + Sync`: every iothread serving one of its queues shares it; its
/// clones share the image, its size and its counters.
#[derive(Debug, Clone)]
pub struct BlockDevice {
    image: Arc<Image>,
    options: DiskOptions,
    /// Opened for an upgrade ([`open_inactive`](Self::open_inactive)): its transport
    /// activates it when the first frontend connects.
    activates_on_connect: bool,
}

/// Refuses options no disk can be served with.
fn check_options(options: &DiskOptions) -> Result<(), DeviceError> {
    if options.serial.len() > spec::ID_BYTES {
        return Err(DeviceError::SerialTooLong(options.serial.clone()));
    }
    if options.queues == 0 || options.queues > 256 {
        return Err(DeviceError::BadQueueCount(options.queues));
    }
    Ok(())
}

impl BlockDevice {
    /// A disk over `image`, opened already (and perhaps served by other exports too). The
    /// disk is read-only if the options or the image say so; the options' other image fields
    /// (`format`, `locking`, `share_rw`) are not used here: the image is open.
    pub fn on_image(image: Arc<Image>, mut options: DiskOptions) -> Result<Self, DeviceError> {
        check_options(&options)?;
        options.read_only |= image.is_read_only();
        Ok(BlockDevice {
            image,
            options,
            activates_on_connect: false,
        })
    }

    /// Opens `image` (a file or a block device) with `O_DIRECT`, read-only when the options
    /// say so, as the format the options give (see [`ImageFormat`]), and reads its size
    /// ([`Image::open`]).
    ///
    /// The image is locked first, as the options' `locking` and `share_rw` say (a qcow2
    /// image's backing files too, as they are opened): another process's use that conflicts
    /// is [`OpenError::Lock`](aio_block::image::OpenError::Lock), and nothing is read or written before the lock is held.
    pub fn open(image: &Path, options: DiskOptions) -> Result<Self, DeviceError> {
        check_options(&options)?;
        let opened = Image::open(image, options.image_options())?;
        Self::on_image(Arc::new(opened), options)
    }

    /// Opens `image` as [`open`](Self::open) does, but inactive ([`Image::open_inactive`]): no
    /// lock is taken and nothing is written (a qcow2 image is opened read-only), for another
    /// process (the daemon this one succeeds, a migration's source) may still own it; only
    /// reads are served. [`activate`](Self::activate) takes the locks the options ask for,
    /// once that process has let them go, and reads the metadata afresh.
    pub fn open_inactive(image: &Path, options: DiskOptions) -> Result<Self, DeviceError> {
        check_options(&options)?;
        let opened = Image::open_inactive(image, options.image_options())?;
        let mut device = Self::on_image(Arc::new(opened), options)?;
        device.activates_on_connect = true;
        Ok(device)
    }

    /// Whether the disk was opened for an upgrade ([`open_inactive`](Self::open_inactive)),
    /// to be activated by its transport when the first frontend connects. A disk over an
    /// image opened inactive otherwise ([`on_image`](Self::on_image), a migration's
    /// destination) stays inactive until its owner activates the image.
    pub fn activates_on_connect(&self) -> bool {
        self.activates_on_connect
    }

    /// A disk of `size` bytes with nothing behind it ([`Image::null`]): reads return zeros,
    /// writes, flushes, discards and write-zeroes succeed and keep nothing (QEMU's `null-co`
    /// with `read-zeroes=on`). It measures the virtio path's own cost.
    pub fn null(size: u64, options: DiskOptions) -> Result<Self, DeviceError> {
        check_options(&options)?;
        let image = Image::null(size, options.image_options())?;
        Self::on_image(Arc::new(image), options)
    }

    /// A disk that is a window of an image already open ([`Image::window`]): `size` bytes
    /// from `offset`, as QEMU's raw driver's `offset=` and `size=` serve part of a file or
    /// device. No lock is taken: the file is the caller's.
    pub fn window(
        file: IoFile,
        offset: u64,
        size: u64,
        options: DiskOptions,
    ) -> Result<Self, DeviceError> {
        check_options(&options)?;
        let image = Image::window(file, offset, size, options.image_options())?;
        Self::on_image(Arc::new(image), options)
    }

    /// The image under the disk.
    pub fn image(&self) -> &Arc<Image> {
        &self.image
    }

    /// Makes an inactive disk active ([`Image::activate`]): takes its image's locks and reads
    /// its metadata afresh; a conflict leaves it inactive.
    pub fn activate(&self) -> Result<(), ActivationError> {
        self.image.activate()
    }

    /// [`activate`](Self::activate), tried again while another process holds a conflicting
    /// lock, until `wait` has passed ([`Image::activate_within`]).
    pub fn activate_within(&self, wait: std::time::Duration) -> Result<(), ActivationError> {
        self.image.activate_within(wait)
    }

    /// Makes the disk inactive ([`Image::inactivate`]): its image's cached metadata written
    /// back, its locks let go, only reads served from then on. The caller has drained the
    /// disk's requests (its queues stopped or idle).
    pub fn inactivate(&self) -> Result<(), ActivationError> {
        self.image.inactivate()
    }

    /// Whether the disk serves every request, not only reads ([`Image::is_active`]).
    pub fn is_active(&self) -> bool {
        self.image.is_active()
    }

    /// Makes the disk `bytes` long ([`Image::resize`]). The driver is not told here: its
    /// transport reads [`config`](Self::config) again.
    pub fn resize(&self, bytes: u64) -> Result<(), ResizeError> {
        self.image.resize(bytes)
    }

    /// Where the disk's sector 0 is in the file ([`Image::offset`]).
    pub fn offset(&self) -> u64 {
        self.image.offset()
    }

    /// The raw image, for requests of its own ([`Image::file`]).
    pub fn file(&self) -> Option<&IoFile> {
        self.image.file()
    }

    /// What is served: `"raw"`, `"qcow2"` or `"null"`.
    pub fn format_name(&self) -> &'static str {
        self.image.format_name()
    }

    /// The backing files of a qcow2 image, nearest first (empty for any other disk).
    pub fn backing_chain(&self) -> &[PathBuf] {
        self.image.backing_chain()
    }

    /// Writes what the image caches and syncs its files ([`Image::close`]). A stopping
    /// server calls it after its queues have stopped.
    pub fn close(&self) -> io::Result<()> {
        self.image.close()
    }

    /// The size in 512-byte sectors (now: [`resize`](Self::resize) changes it).
    pub fn capacity_sectors(&self) -> u64 {
        self.image.size() / SECTOR_SIZE
    }

    /// Whether the image is a dirty qcow2 image served read-only ([`Image::is_dirty`]).
    pub fn is_dirty(&self) -> bool {
        self.image.is_dirty()
    }

    /// The options it was opened with (`read_only` set for a [dirty](Self::is_dirty) image).
    pub fn options(&self) -> &DiskOptions {
        &self.options
    }

    /// The image's I/O statistics (QEMU's `query-blockstats`), counted by the queues that
    /// serve it (and by any other export of the same image).
    pub fn stats(&self) -> &BlockStats {
        self.image.stats()
    }

    /// What `GET_ID` writes: the serial, NUL-padded to 20 bytes.
    pub fn id_bytes(&self) -> [u8; spec::ID_BYTES] {
        let mut id = [0u8; spec::ID_BYTES];
        let serial = self.options.serial.as_bytes();
        id[..serial.len()].copy_from_slice(serial);
        id
    }

    /// The virtio feature bits the device offers (transport bits included: `VERSION_1`,
    /// `EVENT_IDX`, `INDIRECT_DESC`).
    pub fn features(&self) -> u64 {
        let mut f = bit(feature::VERSION_1)
            | bit(feature::EVENT_IDX)
            | bit(feature::INDIRECT_DESC)
            | bit(feature::SEG_MAX)
            | bit(feature::SIZE_MAX)
            | bit(feature::BLK_SIZE)
            | bit(feature::FLUSH)
            | bit(feature::MQ);
        if self.options.read_only {
            f |= bit(feature::RO);
        } else {
            f |= bit(feature::DISCARD) | bit(feature::WRITE_ZEROES);
        }
        f
    }

    /// The config space's values.
    pub fn config(&self) -> BlkConfig {
        BlkConfig {
            capacity: self.capacity_sectors(),
            size_max: SIZE_MAX,
            seg_max: SEG_MAX,
            blk_size: SECTOR_SIZE as u32,
            num_queues: self.options.queues,
            max_discard_sectors: MAX_RANGE_SECTORS,
            max_discard_seg: 1,
            discard_sector_alignment: 1,
            max_write_zeroes_sectors: MAX_RANGE_SECTORS,
            max_write_zeroes_seg: 1,
            write_zeroes_may_unmap: true,
        }
    }

    /// The checks every chain of this disk's queues passes.
    pub fn chain_limits(&self) -> ChainLimits {
        ChainLimits {
            capacity_sectors: self.capacity_sectors(),
            read_only: self.options.read_only,
            seg_max: SEG_MAX,
            size_max: SIZE_MAX,
            max_discard_sectors: MAX_RANGE_SECTORS,
            max_write_zeroes_sectors: MAX_RANGE_SECTORS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::KnownFormat;
    use aio_block::image::OpenError;

    /// A QED header is refused by default, naming the format, and served with `format=raw`
    /// (a VMM that opens images through `BlockDevice` gets the same rule as the daemon).
    #[test]
    fn an_image_with_another_formats_header_opens_only_as_raw_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let qed = dir.path().join("x.qed");
        let mut bytes = vec![0u8; 64 << 10];
        bytes[..4].copy_from_slice(b"QED\0");
        std::fs::write(&qed, &bytes).unwrap();
        let e = BlockDevice::open(&qed, DiskOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::Image(OpenError::FormatFound {
                    format: KnownFormat::Qed,
                    ..
                })
            ),
            "{e}"
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidInput);
        let as_raw = DiskOptions {
            format: ImageFormat::Raw,
            ..DiskOptions::default()
        };
        let d = BlockDevice::open(&qed, as_raw).unwrap();
        assert_eq!(d.capacity_sectors(), 128);
    }

    #[test]
    fn clones_share_the_image_and_its_size() {
        let disk = BlockDevice::null(1 << 20, DiskOptions::default()).unwrap();
        let clone = disk.clone();
        disk.resize(4 << 20).unwrap();
        assert_eq!(clone.capacity_sectors(), (4 << 20) / 512);
        assert_eq!(disk.config().capacity, (4 << 20) / 512);
        assert_eq!(disk.chain_limits().capacity_sectors, (4 << 20) / 512);
        let e = BlockDevice::null(
            1 << 20,
            DiskOptions {
                queues: 0,
                ..DiskOptions::default()
            },
        );
        assert!(matches!(e, Err(DeviceError::BadQueueCount(0))));
    }
}
