//! The disk behind a virtio-blk device: its image, its size and the limits it tells the driver.
//!
//! This module owns opening the image (`O_DIRECT`, a file or a block device, raw or qcow2, or
//! no image at all: the null device), the format rule of [`crate::format`] applied to it, the
//! feature bits and the config space the device offers; it never touches a queue or guest
//! memory.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use aio_block::lock::{Access, ImageLock, LockMode};
use aio_core::engine::{AlignedBuf, IoFile};

use crate::chain::ChainLimits;
use crate::format::{self, ImageFormat, KnownFormat};
use crate::spec::{self, bit, feature, BlkConfig, SECTOR_SIZE};

mod error;
mod handoff;
mod resize;
pub use error::DeviceError;
pub use resize::ResizeError;

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

/// Opens `path` (a file or a block device) with `O_DIRECT`, for writing when `writable`, and
/// reads its size (seeking to the end works for a block device as for a file).
pub(crate) fn open_direct(path: &Path, writable: bool) -> io::Result<(std::fs::File, u64)> {
    use std::io::Seek;
    let file = OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)?;
    let bytes = (&file).seek(io::SeekFrom::End(0))?;
    Ok((file, bytes))
}

/// The known format the first bytes of `file` (opened `O_DIRECT`) belong to, if any.
fn probe_header(file: &std::fs::File) -> io::Result<Option<KnownFormat>> {
    use std::os::unix::fs::FileExt;
    // One aligned 4 KiB read: a whole logical block for every device (`O_DIRECT`), of which
    // the probe looks at the first bytes; an image smaller than that reads short.
    let mut buf = AlignedBuf::new(4096);
    let n = file.read_at(&mut buf[..], 0)?;
    Ok(format::probe(&buf[..n.min(format::PROBE_BYTES)]))
}

/// What a disk's sectors are stored in.
#[derive(Debug, Clone)]
pub(crate) enum Backing {
    /// A raw file or block device, from `offset`. `probed`: its format was found by probing
    /// (`format=auto`), so a write must not give sector 0 a known format's magic.
    Raw {
        file: IoFile,
        offset: u64,
        probed: bool,
        /// A [window](BlockDevice::window): its size is the one given, never resized.
        window: bool,
        /// The image's locks (none for a window: its file is the caller's).
        _lock: Option<std::sync::Arc<ImageLock>>,
    },
    /// Nothing: reads return zeros, writes are dropped (QEMU's `null-co`, `read-zeroes=on`).
    Null,
    /// A qcow2 image and its backing chain.
    #[cfg(feature = "qcow2")]
    Qcow2(std::sync::Arc<crate::image::Qcow2Image>),
}

/// One virtio-blk disk: the image (opened `O_DIRECT`), its capacity and what the driver is
/// told. `Send + Sync`: every iothread serving one of its queues shares it.
#[derive(Debug, Clone)]
pub struct BlockDevice {
    backing: Backing,
    /// The size in sectors, shared by every clone: [`BlockDevice::resize`] changes it while
    /// queues serve the disk, and each batch of requests reads it once.
    capacity_sectors: std::sync::Arc<std::sync::atomic::AtomicU64>,
    options: DiskOptions,
    stats: std::sync::Arc<crate::stats::BlockStats>,
    /// The locks of a disk opened [inactive](BlockDevice::open_inactive), taken on activation.
    pending: Option<std::sync::Arc<handoff::PendingLocks>>,
    /// A dirty qcow2 image served read-only though the options asked for writes.
    dirty: bool,
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

/// A capacity the clones of one device share.
fn shared(sectors: u64) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
    std::sync::Arc::new(std::sync::atomic::AtomicU64::new(sectors))
}

/// A whole, positive number of sectors, or the error naming `path`.
fn sectors(path: &Path, bytes: u64) -> Result<u64, DeviceError> {
    if bytes < SECTOR_SIZE || bytes % SECTOR_SIZE != 0 {
        return Err(DeviceError::BadSize {
            path: path.to_path_buf(),
            bytes,
        });
    }
    Ok(bytes / SECTOR_SIZE)
}

impl BlockDevice {
    /// Opens `image` (a file or a block device) with `O_DIRECT`, read-only when the options
    /// say so, as the format the options give (see [`ImageFormat`]), and reads its size.
    ///
    /// The image is locked first, as the options' `locking` and `share_rw` say (a qcow2
    /// image's backing files too, as they are opened): another process's use that conflicts
    /// is [`DeviceError::Lock`], and nothing is read or written before the lock is held.
    pub fn open(image: &Path, options: DiskOptions) -> Result<Self, DeviceError> {
        Self::open_as(image, options, true)
    }

    /// [`open`](Self::open), refusing a qcow2 image (for [`open_inactive`](Self::open_inactive)).
    fn open_raw_only(image: &Path, options: DiskOptions) -> Result<Self, DeviceError> {
        Self::open_as(image, options, false)
    }

    fn open_as(image: &Path, options: DiskOptions, qcow2: bool) -> Result<Self, DeviceError> {
        check_options(&options)?;
        let open_error = |source| DeviceError::Open {
            path: image.to_path_buf(),
            source,
        };
        let (file, bytes) = open_direct(image, !options.read_only).map_err(open_error)?;
        let writable = !options.read_only;
        // The access is the format's (a qcow2 file never shares write), so the header is
        // probed before locking: a read of 4 KiB, which no lock forbids.
        let found = match options.format {
            ImageFormat::Raw => None,
            _ => probe_header(&file).map_err(open_error)?,
        };
        match (options.format, found) {
            (ImageFormat::Qcow2, _) | (ImageFormat::Auto, Some(KnownFormat::Qcow2)) if !qcow2 => {
                return Err(DeviceError::NotInactive {
                    path: image.to_path_buf(),
                })
            }
            (ImageFormat::Qcow2, _) | (ImageFormat::Auto, Some(KnownFormat::Qcow2)) => {
                return Self::open_qcow2(image, options, found, file);
            }
            (ImageFormat::Auto, Some(format)) => {
                return Err(DeviceError::FormatFound {
                    path: image.to_path_buf(),
                    format,
                })
            }
            _ => {}
        }
        let access = Access::disk(writable, options.share_rw);
        let lock = ImageLock::acquire(&file, image, access, options.locking)?;
        Ok(BlockDevice {
            capacity_sectors: shared(sectors(image, bytes)?),
            backing: Backing::Raw {
                file: IoFile::new(file),
                offset: 0,
                probed: options.format == ImageFormat::Auto,
                window: false,
                _lock: Some(std::sync::Arc::new(lock)),
            },
            options,
            stats: Default::default(),
            pending: None,
            dirty: false,
        })
    }

    /// Opens the qcow2 image whose file is `file` (opened for the probe, locked here first).
    /// A dirty image (lazy refcounts after a crash) is served read-only, whatever the options
    /// asked: [`is_dirty`](Self::is_dirty) says so, for the caller to warn.
    #[cfg(feature = "qcow2")]
    fn open_qcow2(
        image: &Path,
        mut options: DiskOptions,
        _found: Option<KnownFormat>,
        file: std::fs::File,
    ) -> Result<Self, DeviceError> {
        let dirty = !options.read_only && crate::image::is_dirty(image);
        if dirty {
            options.read_only = true;
        }
        let access = Access::qcow2_file(!options.read_only);
        let lock = ImageLock::acquire(&file, image, access, options.locking)?;
        drop(file);
        let qcow2 = crate::image::Qcow2Image::open(image, !options.read_only, lock)?;
        Ok(BlockDevice {
            dirty,
            capacity_sectors: shared(sectors(image, qcow2.size())?),
            backing: Backing::Qcow2(std::sync::Arc::new(qcow2)),
            options,
            stats: Default::default(),
            pending: None,
        })
    }

    #[cfg(not(feature = "qcow2"))]
    fn open_qcow2(
        image: &Path,
        _options: DiskOptions,
        found: Option<KnownFormat>,
        _file: std::fs::File,
    ) -> Result<Self, DeviceError> {
        Err(match found {
            Some(KnownFormat::Qcow2) => DeviceError::FormatNotBuilt {
                path: image.to_path_buf(),
                format: KnownFormat::Qcow2,
            },
            found => DeviceError::NotQcow2 {
                path: image.to_path_buf(),
                found,
            },
        })
    }

    /// A disk of `size` bytes with nothing behind it: reads return zeros, writes, flushes,
    /// discards and write-zeroes succeed and keep nothing (QEMU's `null-co` with
    /// `read-zeroes=on`). It measures the virtio path's own cost.
    pub fn null(size: u64, options: DiskOptions) -> Result<Self, DeviceError> {
        check_options(&options)?;
        Ok(BlockDevice {
            capacity_sectors: shared(sectors(Path::new("null"), size)?),
            backing: Backing::Null,
            options,
            stats: Default::default(),
            pending: None,
            dirty: false,
        })
    }

    /// A disk that is a window of an image already open (`O_DIRECT`, with the access the
    /// options need): `size` bytes from `offset`, as QEMU's raw driver's `offset=` and
    /// `size=` serve part of a file or device. Both are whole sectors; the image's format is
    /// not probed (the window is raw by construction), and no lock is taken: the file is the
    /// caller's, to lock with [`aio_block::lock::ImageLock`] as it sees fit.
    pub fn window(
        file: IoFile,
        offset: u64,
        size: u64,
        options: DiskOptions,
    ) -> Result<Self, DeviceError> {
        check_options(&options)?;
        if size < SECTOR_SIZE || size % SECTOR_SIZE != 0 || offset % SECTOR_SIZE != 0 {
            return Err(DeviceError::BadWindow { offset, size });
        }
        Ok(BlockDevice {
            backing: Backing::Raw {
                file,
                offset,
                probed: false,
                window: true,
                _lock: None,
            },
            capacity_sectors: shared(size / SECTOR_SIZE),
            options,
            stats: Default::default(),
            pending: None,
            dirty: false,
        })
    }

    /// Where the disk's sector 0 is in the file (0 unless a [`window`](Self::window), and for
    /// a disk that is not a raw file).
    pub fn offset(&self) -> u64 {
        match &self.backing {
            Backing::Raw { offset, .. } => *offset,
            _ => 0,
        }
    }

    /// What the disk's sectors are stored in (for the request path).
    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The raw image, for requests of its own: None for a disk that is not a raw file or
    /// block device (a qcow2 image, the null device).
    pub fn file(&self) -> Option<&IoFile> {
        match &self.backing {
            Backing::Raw { file, .. } => Some(file),
            _ => None,
        }
    }

    /// What is served: `"raw"`, `"qcow2"` or `"null"`.
    pub fn format_name(&self) -> &'static str {
        match &self.backing {
            Backing::Raw { .. } => "raw",
            Backing::Null => "null",
            #[cfg(feature = "qcow2")]
            Backing::Qcow2(_) => "qcow2",
        }
    }

    /// The backing files of a qcow2 image, nearest first (empty for any other disk).
    pub fn backing_chain(&self) -> &[PathBuf] {
        match &self.backing {
            #[cfg(feature = "qcow2")]
            Backing::Qcow2(image) => image.backing_chain(),
            _ => &[],
        }
    }

    /// Writes what the image caches (a qcow2 image's metadata) and syncs its files; a raw
    /// image and the null device have nothing cached. A stopping server calls it after its
    /// queues have stopped (dropping the last handle of the disk does it too).
    pub fn close(&self) -> io::Result<()> {
        match &self.backing {
            #[cfg(feature = "qcow2")]
            Backing::Qcow2(image) => image.close(),
            _ => Ok(()),
        }
    }
    /// The size in 512-byte sectors (now: [`resize`](Self::resize) changes it).
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the image is a dirty qcow2 image (its refcounts stale after a crash with
    /// `lazy_refcounts=on`) served read-only though the options asked for writes, as QEMU
    /// serves one it opens read-only; `qemu-img check -r all` repairs it. The options then
    /// say `read_only`.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The options it was opened with (`read_only` set for a [dirty](Self::is_dirty) image).
    pub fn options(&self) -> &DiskOptions {
        &self.options
    }

    /// The disk's I/O statistics (QEMU's `query-blockstats`), counted by the queues that
    /// serve it.
    pub fn stats(&self) -> &crate::stats::BlockStats {
        &self.stats
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

    /// A QED header is refused by default, naming the format, and served with `format=raw`;
    /// a raw image opens either way. (A VMM that opens images through `BlockDevice` gets the
    /// same rule as the daemon.)
    #[test]
    fn an_image_with_another_formats_header_opens_only_as_raw_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (qcow2, raw) = (dir.path().join("x.qed"), dir.path().join("x.img"));
        let mut bytes = vec![0u8; 64 << 10];
        bytes[..4].copy_from_slice(b"QED\0");
        std::fs::write(&qcow2, &bytes).unwrap();
        std::fs::write(&raw, vec![0u8; 64 << 10]).unwrap();
        let e = BlockDevice::open(&qcow2, DiskOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::FormatFound {
                    format: KnownFormat::Qed,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("qed") && e.to_string().contains("format=raw"),
            "{e}"
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidInput);
        let as_raw = DiskOptions {
            format: ImageFormat::Raw,
            ..DiskOptions::default()
        };
        let d = BlockDevice::open(&qcow2, as_raw).unwrap();
        assert_eq!(d.capacity_sectors(), 128);
        BlockDevice::open(&raw, DiskOptions::default()).unwrap();
    }
}
