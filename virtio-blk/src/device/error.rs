//! Why a disk cannot be served: [`DeviceError`], one variant per refusal, each naming the
//! image.
//!
//! This module owns the error type and its conversion to `io::Error`; it opens nothing.

use std::io;
use std::path::PathBuf;

use aio_block::lock::LockError;

use crate::format::{KnownFormat, Qcow2Refusal};

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
    /// `format=qcow2`, and the image is not a qcow2 image.
    #[error("image {path}: format=qcow2, but it is {}", found_text(.found))]
    NotQcow2 {
        /// The image.
        path: PathBuf,
        /// What its header says (None: no known format).
        found: Option<KnownFormat>,
    },
    /// A qcow2 image (or a qcow2 backing file) that is refused before opening: encrypted, a
    /// version not served, an incompatible feature bit.
    #[error("image {path}: {reason}")]
    Qcow2Refused {
        /// The image or backing file.
        path: PathBuf,
        /// Why.
        #[source]
        reason: Qcow2Refusal,
    },
    /// A backing file whose header is a format other than raw or qcow2.
    #[error("backing file {path}: is a {format} image, which is not served as a backing file")]
    BackingFormat {
        /// The backing file.
        path: PathBuf,
        /// What its header says.
        format: KnownFormat,
    },
    /// A backing chain that comes back to a file already in it (or is absurdly long).
    #[error(
        "backing file {path}: the backing chain loops back to it (or is longer than 64 files)"
    )]
    BackingLoop {
        /// The file met twice.
        path: PathBuf,
    },
    /// The image format library could not open the image (or its chain).
    #[error("image {path}: {source}")]
    Image {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The image (or a qcow2 image's backing file) is in use by another process whose locks
    /// conflict with this disk's (QEMU's words: `Failed to get "write" lock`), or could not
    /// be locked.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A qcow2 image asked to open [inactive](super::BlockDevice::open_inactive): its metadata, read
    /// while another process still changes it, would be stale.
    #[error(
        "image {path}: a qcow2 image is opened only once its other user has let it go \
         (its metadata would be read stale): stop that user first"
    )]
    NotInactive {
        /// The image.
        path: PathBuf,
    },
    /// This build has no support for the image's format (the crate's `qcow2` feature is off).
    #[error(
        "image {path}: is a {format} image, and this build serves no {format} (feature `qcow2`)"
    )]
    FormatNotBuilt {
        /// The image.
        path: PathBuf,
        /// What its header says.
        format: KnownFormat,
    },
}

/// What a probe found, for a message.
fn found_text(found: &Option<KnownFormat>) -> String {
    match found {
        Some(f) => format!("a {f} image"),
        None => "no known format (a raw image?)".to_string(),
    }
}

impl From<DeviceError> for io::Error {
    fn from(e: DeviceError) -> Self {
        let kind = match &e {
            DeviceError::Open { source, .. } | DeviceError::Image { source, .. } => source.kind(),
            DeviceError::Lock(LockError::Conflict { .. }) => io::ErrorKind::ResourceBusy,
            DeviceError::Lock(_) => io::ErrorKind::Other,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}
