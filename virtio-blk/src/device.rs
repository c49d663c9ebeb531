//! The disk behind a virtio-blk device: its image, its size and the limits it tells the driver.
//!
//! This module owns opening the image (`O_DIRECT`, a file or a block device), the feature
//! bits and the config space the device offers; it never touches a queue or guest memory.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use aio_core::engine::{AlignedBuf, IoFile};

use crate::chain::ChainLimits;
use crate::format::{self, ImageFormat, KnownFormat};
use crate::spec::{self, bit, feature, BlkConfig, SECTOR_SIZE};

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
    /// The image's format: [`ImageFormat::Auto`] refuses an image whose header is a known
    /// format's, [`ImageFormat::Raw`] serves any image as raw.
    pub format: ImageFormat,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            read_only: false,
            serial: String::new(),
            queues: 1,
            format: ImageFormat::Auto,
        }
    }
}

/// Why a disk cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The image could not be opened with `O_DIRECT` (or its size read).
    #[error("image {path}: {source}")]
    Open {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The image is smaller than one sector, or not a whole number of them.
    #[error("image {path}: {bytes} bytes is not a positive multiple of 512")]
    BadSize {
        /// The image.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// A window that is not whole sectors, or empty.
    #[error("window of {size} bytes at {offset}: both must be whole 512-byte sectors, the size at least one")]
    BadWindow {
        /// Where it starts.
        offset: u64,
        /// Its size.
        size: u64,
    },
    /// The serial is longer than the 20 bytes `GET_ID` answers.
    #[error("serial '{0}' is longer than 20 bytes")]
    SerialTooLong(String),
    /// Zero queues, or more than 256.
    #[error("{0} queues (1 to 256)")]
    BadQueueCount(u16),
    /// The image's header is a known format's, and the disk did not say `format=raw`: served
    /// as raw, the guest would see and could overwrite the format's metadata.
    #[error(
        "image {path}: is a {format} image, which is not served; \
         give format=raw to serve the file as it is (the guest then sees the {format} metadata)"
    )]
    FormatFound {
        /// The image.
        path: PathBuf,
        /// What its header says.
        format: KnownFormat,
    },
}

impl From<DeviceError> for io::Error {
    fn from(e: DeviceError) -> Self {
        let kind = match &e {
            DeviceError::Open { source, .. } => source.kind(),
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
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

/// One virtio-blk disk: the image (opened `O_DIRECT`), its capacity and what the driver is
/// told. `Send + Sync`: every iothread serving one of its queues shares it.
#[derive(Debug, Clone)]
pub struct BlockDevice {
    file: IoFile,
    /// Where the disk starts in the file (a window: QEMU's raw `offset=`).
    offset: u64,
    capacity_sectors: u64,
    options: DiskOptions,
}

impl BlockDevice {
    /// Opens `image` (a file or a block device) with `O_DIRECT`, read-only when the options
    /// say so, and reads its size.
    pub fn open(image: &Path, options: DiskOptions) -> Result<Self, DeviceError> {
        if options.serial.len() > spec::ID_BYTES {
            return Err(DeviceError::SerialTooLong(options.serial));
        }
        if options.queues == 0 || options.queues > 256 {
            return Err(DeviceError::BadQueueCount(options.queues));
        }
        let open_error = |source| DeviceError::Open {
            path: image.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(image)
            .map_err(open_error)?;
        // Seeking to the end works for a block device as for a file.
        let bytes = {
            use std::io::Seek;
            let mut f = &file;
            f.seek(io::SeekFrom::End(0)).map_err(open_error)?
        };
        if bytes < SECTOR_SIZE || bytes % SECTOR_SIZE != 0 {
            return Err(DeviceError::BadSize {
                path: image.to_path_buf(),
                bytes,
            });
        }
        if options.format == ImageFormat::Auto {
            if let Some(format) = probe_header(&file).map_err(open_error)? {
                return Err(DeviceError::FormatFound {
                    path: image.to_path_buf(),
                    format,
                });
            }
        }
        Ok(BlockDevice {
            file: IoFile::new(file),
            offset: 0,
            capacity_sectors: bytes / SECTOR_SIZE,
            options,
        })
    }

    /// A disk that is a window of an image already open (`O_DIRECT`, with the access the
    /// options need): `size` bytes from `offset`, as QEMU's raw driver's `offset=` and
    /// `size=` serve part of a file or device. Both are whole sectors; the image's format is
    /// not probed (the window is raw by construction).
    pub fn window(
        file: IoFile,
        offset: u64,
        size: u64,
        options: DiskOptions,
    ) -> Result<Self, DeviceError> {
        if options.serial.len() > spec::ID_BYTES {
            return Err(DeviceError::SerialTooLong(options.serial));
        }
        if options.queues == 0 || options.queues > 256 {
            return Err(DeviceError::BadQueueCount(options.queues));
        }
        if size < SECTOR_SIZE || size % SECTOR_SIZE != 0 || offset % SECTOR_SIZE != 0 {
            return Err(DeviceError::BadWindow { offset, size });
        }
        Ok(BlockDevice {
            file,
            offset,
            capacity_sectors: size / SECTOR_SIZE,
            options,
        })
    }

    /// Where the disk's sector 0 is in the file (0 unless a [`window`](Self::window)).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The image, for requests.
    pub fn file(&self) -> &IoFile {
        &self.file
    }

    /// The size in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }

    /// The options it was opened with.
    pub fn options(&self) -> &DiskOptions {
        &self.options
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
            capacity: self.capacity_sectors,
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
            capacity_sectors: self.capacity_sectors,
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

    /// A qcow2 header is refused by default, naming the format, and served with
    /// `format=raw`; a raw image opens either way. (A VMM that opens images through
    /// `BlockDevice` gets the same rule as the daemon.)
    #[test]
    fn an_image_with_another_formats_header_opens_only_as_raw_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (qcow2, raw) = (dir.path().join("x.qcow2"), dir.path().join("x.img"));
        let mut bytes = vec![0u8; 64 << 10];
        bytes[..8].copy_from_slice(b"QFI\xfb\0\0\0\x03");
        std::fs::write(&qcow2, &bytes).unwrap();
        std::fs::write(&raw, vec![0u8; 64 << 10]).unwrap();
        let e = BlockDevice::open(&qcow2, DiskOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::FormatFound {
                    format: KnownFormat::Qcow2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("qcow2") && e.to_string().contains("format=raw"),
            "{e}"
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidInput);
        let as_raw = DiskOptions {
            format: ImageFormat::Raw,
            ..DiskOptions::default()
        };
        let d = BlockDevice::open(&qcow2, as_raw).unwrap();
        assert_eq!(d.capacity_sectors, 128);
        BlockDevice::open(&raw, DiskOptions::default()).unwrap();
    }
}
