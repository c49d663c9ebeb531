//! Why an image cannot be opened ([`OpenError`], one variant per refusal, each naming the
//! image), made inactive or active ([`ActivationError`]), or resized ([`ResizeError`]).
//!
//! This module owns the error type and its conversion to `io::Error`; it opens nothing.

use std::io;
use std::path::PathBuf;

use crate::lock::LockError;

use crate::format::{KnownFormat, Qcow2Refusal};

/// Why an image cannot be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
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
    /// The image's header is a known format's, and the options did not say `format=raw`: served
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
    /// conflict with this image's (QEMU's words: `Failed to get "write" lock`), or could not
    /// be locked.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// An image asked to open [inactive](super::Image::open_inactive) of a kind that cannot
    /// be: none is refused today (raw files and devices, qcow2, RBD and null all open
    /// inactive); kept for callers that still match it.
    #[error("image {path}: this kind of image cannot be opened inactive")]
    NotInactive {
        /// The image.
        path: PathBuf,
    },
    /// The image's format is known but not served from where it is stored.
    #[error("image {path}: {reason}")]
    FormatNotServed {
        /// The image.
        path: PathBuf,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// An RBD image could not be reached, opened or locked.
    #[cfg(feature = "rbd")]
    #[error(transparent)]
    Rbd(#[from] aio_rbd::RbdError),
    /// This build has no support for the image's format (the `qcow2` feature of `aio-block` is off).
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

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> Self {
        let kind = match &e {
            OpenError::Open { source, .. } | OpenError::Image { source, .. } => source.kind(),
            OpenError::Lock(LockError::Conflict { .. }) => io::ErrorKind::ResourceBusy,
            OpenError::Lock(_) => io::ErrorKind::Other,
            #[cfg(feature = "rbd")]
            OpenError::Rbd(e) => io::Error::from(e.clone()).kind(),
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// Why an image was not made [inactive](super::Image::inactivate) or
/// [active](super::Image::activate): it stays as it was (inactive images stay readable).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActivationError {
    /// The image's locks (or a qcow2 image's backing files') could not be taken: another
    /// process's use conflicts ([`LockError::Conflict`], QEMU's words; [`qemu_desc`] gives
    /// QMP's text), or the call failed.
    ///
    /// [`qemu_desc`]: ActivationError::qemu_desc
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Requests still hold the image (a qcow2 image's requests and metadata tasks hold it
    /// until their end): the caller has not drained it. Nothing was changed.
    #[error("image {}: requests are still in flight: drain the image first", .path.display())]
    InFlight {
        /// The image.
        path: PathBuf,
    },
    /// Writing back what the image caches (a qcow2 image's metadata) or syncing its files
    /// failed: the image stays active.
    #[error("image {}: writing back its cached data failed: {source}", .path.display())]
    Flush {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The image could not be opened again: a qcow2 image's metadata re-read on activation
    /// (a header now refused, a dirty image asked for writes, an I/O error), or read-only on
    /// inactivation, or its new size is not whole sectors.
    #[error(transparent)]
    Reopen(OpenError),
    /// A qcow2 image's backing chain is not the one it was opened with (another user rebased
    /// or committed it meanwhile): open the image anew.
    #[error(
        "image {}: its backing chain changed while it was inactive: open it again",
        .path.display()
    )]
    ChainChanged {
        /// The image.
        path: PathBuf,
    },
    /// An RBD image's exclusive lock could not be taken (another client holds it:
    /// [`aio_rbd::RbdError::Locked`]) or released, or librbd failed.
    #[cfg(feature = "rbd")]
    #[error(transparent)]
    Rbd(#[from] aio_rbd::RbdError),
}

impl ActivationError {
    /// Whether another user holds the image (a conflicting lock byte, an RBD image's
    /// exclusive lock held by another client): trying again once it has let go may succeed.
    pub fn is_conflict(&self) -> bool {
        match self {
            ActivationError::Lock(LockError::Conflict { .. }) => true,
            #[cfg(feature = "rbd")]
            ActivationError::Rbd(aio_rbd::RbdError::Locked { .. }) => true,
            _ => false,
        }
    }

    /// The text QEMU's QMP gives for the refusal (a lock conflict's
    /// [`LockError::qemu_desc`]); the message otherwise.
    pub fn qemu_desc(&self) -> String {
        match self {
            ActivationError::Lock(e) => e.qemu_desc(),
            other => other.to_string(),
        }
    }
}

impl From<OpenError> for ActivationError {
    /// A lock refused while opening again (a backing file's) is [`ActivationError::Lock`].
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Lock(e) => ActivationError::Lock(e),
            #[cfg(feature = "rbd")]
            OpenError::Rbd(e) => ActivationError::Rbd(e),
            other => ActivationError::Reopen(other),
        }
    }
}

impl From<ActivationError> for io::Error {
    fn from(e: ActivationError) -> Self {
        let kind = match &e {
            ActivationError::Lock(LockError::Conflict { .. }) => io::ErrorKind::ResourceBusy,
            ActivationError::InFlight { .. } => io::ErrorKind::ResourceBusy,
            ActivationError::Flush { source, .. } => source.kind(),
            #[cfg(feature = "rbd")]
            ActivationError::Rbd(e) => io::Error::from(e.clone()).kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Why an image was not resized (it keeps its size).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResizeError {
    /// The image is served read-only.
    #[error("the image is read-only")]
    ReadOnly,
    /// The image is [inactive](super::Image::inactivate): another process may own it; only
    /// reads are served until it is [activated](super::Image::activate).
    #[error("the image is inactive")]
    Inactive,
    /// The new size is zero or not a whole number of sectors.
    #[error("the new size must be a positive multiple of 512 (got {bytes})")]
    BadSize {
        /// The size asked for.
        bytes: u64,
    },
    /// The image is a window of its file (QEMU's raw `offset=` / `size=`): its size is fixed.
    #[error(
        "the image is a window of its file ({bytes} bytes from offset {offset}): its size is fixed"
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
            ResizeError::ReadOnly | ResizeError::Inactive => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// Why a block node cannot become an image's backing ([`Image::set_backing_node`]).
///
/// [`Image::set_backing_node`]: super::Image::set_backing_node
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackingNodeError {
    /// The image's kind has no backing (raw, null, RBD).
    #[error("a {0} image has no backing")]
    NoBacking(&'static str),
    /// The image was opened with the backing file its header names.
    #[error(
        "the image was opened with its backing file: open it without (backing=null or a node)"
    )]
    BackingFileOpened,
    /// The node is the image itself, or stands on it.
    #[error("Making the node its own backing would create a loop")]
    Loop,
}
