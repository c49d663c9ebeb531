//! What a server offers: named exports, each an image of the block layer with the
//! protocol's view of it (name, description, writable, the flags and block sizes a client is
//! told).
//!
//! This module owns an export's description and the set clients look exports up in (shared
//! by every connection on every iothread); it never serves a request.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use aio_block::bitmap::DirtyBitmap;
use aio_block::Image;

use crate::proto::{tflag, MAX_PAYLOAD, MAX_STRING};

/// The smallest block a client may address, at the least: one sector. Requests that are not
/// whole blocks are refused (`EINVAL`), as `O_DIRECT` images need.
pub const MIN_BLOCK: u32 = 512;
/// The block size clients are told to prefer.
pub const PREFERRED_BLOCK: u32 = 4096;

/// Why an export cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// A name or description longer than the protocol's 4096 bytes.
    #[error("the export's {what} is {len} bytes; the NBD protocol allows at most 4096")]
    TooLong {
        /// "name" or "description".
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// A writable export of an image opened read-only.
    #[error("export '{0}': writable=on, but its image is read-only")]
    ReadOnlyImage(String),
    /// An export of that name is already offered.
    #[error("an export named '{0}' is already offered")]
    Exists(String),
}

/// One export: an image and how it is offered.
#[derive(Debug)]
pub struct NbdExport {
    name: String,
    description: Option<String>,
    image: Arc<Image>,
    writable: bool,
    multi_conn: bool,
    allocation_depth: bool,
    bitmaps: Vec<Arc<DirtyBitmap>>,
}

impl NbdExport {
    /// An export of `image` named `name`, read-only, without a description.
    pub fn new(name: impl Into<String>, image: Arc<Image>) -> Result<Self, ExportError> {
        let name = name.into();
        if name.len() > MAX_STRING {
            return Err(ExportError::TooLong {
                what: "name",
                len: name.len(),
            });
        }
        Ok(NbdExport {
            name,
            description: None,
            image,
            writable: false,
            multi_conn: true,
            allocation_depth: false,
            bitmaps: Vec::new(),
        })
    }

    /// With a description (`NBD_INFO_DESCRIPTION`, `NBD_OPT_LIST`).
    pub fn description(mut self, text: impl Into<String>) -> Result<Self, ExportError> {
        let text = text.into();
        if text.len() > MAX_STRING {
            return Err(ExportError::TooLong {
                what: "description",
                len: text.len(),
            });
        }
        self.description = Some(text);
        Ok(self)
    }

    /// Writable or not (QEMU's `writable=`, default off). Refused for a read-only image.
    pub fn writable(mut self, writable: bool) -> Result<Self, ExportError> {
        if writable && self.image.is_read_only() {
            return Err(ExportError::ReadOnlyImage(self.name));
        }
        self.writable = writable;
        Ok(self)
    }

    /// Whether clients are told `NBD_FLAG_CAN_MULTI_CONN` (default on). Every connection to
    /// an export shares one image, whose completed writes every other connection reads and
    /// whose flush covers them all: true unless the server takes one connection at a time,
    /// where QEMU does not say it either.
    pub fn multi_conn(mut self, on: bool) -> Self {
        self.multi_conn = on;
        self
    }

    /// Whether the `qemu:allocation-depth` metadata context is offered (QEMU's
    /// `allocation-depth=on`, default off): which layer of the image's chain holds each range.
    pub fn allocation_depth(mut self, on: bool) -> Self {
        self.allocation_depth = on;
        self
    }

    /// Offers `bitmap` as the metadata context `qemu:dirty-bitmap:NAME` (QEMU's
    /// `bitmaps=[NAME]`), after those offered before: its extents are dirty (flag 1) or
    /// clean. Which bitmap may be served, and holding it busy while it is (as QEMU marks an
    /// exported bitmap busy), are the caller's: the export only reads it.
    pub fn dirty_bitmap(mut self, bitmap: Arc<DirtyBitmap>) -> Self {
        self.bitmaps.push(bitmap);
        self
    }

    /// The dirty bitmaps offered, in order (context id 2 is the first's, as QEMU's).
    pub fn dirty_bitmaps(&self) -> &[Arc<DirtyBitmap>] {
        &self.bitmaps
    }

    /// Whether `qemu:allocation-depth` is offered.
    pub fn offers_allocation_depth(&self) -> bool {
        self.allocation_depth
    }

    /// The name clients ask for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description, if any.
    pub fn description_text(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The image served.
    pub fn image(&self) -> &Arc<Image> {
        &self.image
    }

    /// Whether clients may write.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The size clients see: the image's, in whole sectors (as QEMU rounds down).
    pub fn size(&self) -> u64 {
        self.image.size() & !u64::from(MIN_BLOCK - 1)
    }

    /// The transmission flags clients are told; `structured`: the connection negotiated
    /// structured replies (which `NBD_FLAG_SEND_DF` needs).
    pub fn flags(&self, structured: bool) -> u16 {
        let mut flags = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::SEND_FUA | tflag::SEND_CACHE;
        if self.multi_conn {
            flags |= tflag::CAN_MULTI_CONN;
        }
        if self.writable {
            flags |= tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES | tflag::SEND_FAST_ZERO;
        } else {
            flags |= tflag::READ_ONLY;
        }
        if structured {
            flags |= tflag::SEND_DF;
        }
        flags
    }

    /// The smallest block a request may address: the image file's `O_DIRECT` alignment, at
    /// least [`MIN_BLOCK`].
    pub fn min_block(&self) -> u32 {
        let direct = self.image.file().and_then(|f| f.direct_io_alignment());
        let align = direct.map_or(0, |a| u32::try_from(a.offset).unwrap_or(PREFERRED_BLOCK));
        align.clamp(MIN_BLOCK, PREFERRED_BLOCK)
    }

    /// Minimum, preferred and maximum block sizes (`NBD_INFO_BLOCK_SIZE`).
    pub fn block_sizes(&self) -> [u32; 3] {
        [self.min_block(), PREFERRED_BLOCK, MAX_PAYLOAD]
    }
}

/// The exports a server offers, by name: cheap to clone, shared with every connection.
/// Removing an export stops new clients finding it; connections already on it go on until
/// the caller ends them.
#[derive(Debug, Clone, Default)]
pub struct ExportSet {
    exports: Arc<RwLock<BTreeMap<String, Arc<NbdExport>>>>,
}

impl ExportSet {
    /// No exports.
    pub fn new() -> Self {
        Self::default()
    }

    /// Offers `export`; refused when the name is taken.
    pub fn insert(&self, export: NbdExport) -> Result<Arc<NbdExport>, ExportError> {
        let mut map = self.exports.write().unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(export.name()) {
            return Err(ExportError::Exists(export.name));
        }
        let export = Arc::new(export);
        map.insert(export.name.clone(), export.clone());
        Ok(export)
    }

    /// Stops offering the export named `name`; it, if there was one.
    pub fn remove(&self, name: &str) -> Option<Arc<NbdExport>> {
        self.exports
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)
    }

    /// The export named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<NbdExport>> {
        self.exports
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Every export, by name.
    pub fn list(&self) -> Vec<Arc<NbdExport>> {
        self.exports
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }
}
