//! What a bitmap operation refuses, in QEMU's words (`block/dirty-bitmap.c`,
//! `block/monitor/bitmap-qmp-cmds.c`), so that a management tool matching QEMU's messages
//! reads ours the same.

/// A dirty bitmap operation refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BitmapError {
    /// The name is empty.
    #[error("Bitmap name cannot be empty")]
    EmptyName,
    /// The name is longer than QEMU allows.
    #[error("Bitmap name too long: {0}")]
    NameTooLong(String),
    /// The granularity is not a power of two of at least 512 bytes.
    #[error("Granularity must be power of 2 and at least 512")]
    Granularity,
    /// The image has a bitmap of that name already.
    #[error("Bitmap already exists: {0}")]
    Exists(String),
    /// The image has no bitmap of that name.
    #[error("Dirty bitmap '{0}' not found")]
    NotFound(String),
    /// An export or a job uses the bitmap.
    #[error("Bitmap '{0}' is currently in use by another operation and cannot be used")]
    Busy(String),
    /// The bitmap belongs to an image opened read-only.
    #[error("Bitmap '{0}' is readonly and cannot be modified")]
    ReadOnly(String),
    /// The bitmap was found `in_use` in an image not closed cleanly.
    #[error("Bitmap '{0}' is inconsistent and cannot be used")]
    Inconsistent(String),
    /// A merge of bitmaps over images of different sizes.
    #[error(
        "Bitmaps are of different sizes (destination size is {destination}, source size is \
         {source_size}) and can't be merged"
    )]
    SizeMismatch {
        /// The destination's size in bytes.
        destination: u64,
        /// The source's size in bytes.
        source_size: u64,
    },
    /// A persistent bitmap on an image that cannot store one (not qcow2).
    #[error("Can't store persistent bitmaps to {node}: Operation not supported")]
    NotStorable {
        /// The node (the image's path where the block layer names it).
        node: String,
    },
}

impl BitmapError {
    /// QEMU's hint after the message, where it gives one (an inconsistent bitmap).
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            BitmapError::Inconsistent(_) => {
                Some("Try block-dirty-bitmap-remove to delete this bitmap from disk")
            }
            _ => None,
        }
    }
}
