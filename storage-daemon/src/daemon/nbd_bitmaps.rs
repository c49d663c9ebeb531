//! The dirty bitmaps an NBD export serves (QEMU's `bitmaps=`, `BlockDirtyBitmapOrStr`): found,
//! checked with QEMU's texts (`nbd_export_create` in `nbd/server.c`), and held busy from the
//! export's add to its removal.
//!
//! This module owns those checks and the holds; where a `{node, name}` bitmap is looked up
//! is the caller's (QMP knows the nodes), serving the contexts is `aio-nbd`'s.
//!
//! * A bitmap named alone is the export's image's, or its backing layers' (backing nodes,
//!   and the backing files a qcow2 image opened from its header, as `qemu-nbd -B` finds
//!   them), the nearest first (`Bitmap 'X' is not found`); an enabled one may not be served
//!   read-only from a writable image, for the export's clients would read it change under
//!   them (`Enabled bitmap 'X' incompatible with readonly export`).
//! * Every bitmap is then checked as QEMU's `bdrv_dirty_bitmap_check(BDRV_BITMAP_ALLOW_RO)`:
//!   not busy, not inconsistent; the first refusal, in the list's order, is the answer.
//! * Only when all pass are they held busy (so a refused export holds none); a bitmap
//!   listed twice is served twice and held once, as QEMU's busy flag is one flag.

use std::sync::Arc;

use aio_block::bitmap::{BitmapError, BusyGuard, DirtyBitmap};
use aio_block::Image;

use super::nbd_spec::NbdBitmapSpec;

/// A bitmap an NBD export was to serve, refused in QEMU's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExportBitmapError {
    /// A bitmap named alone that the export's image does not have.
    #[error("Bitmap '{0}' is not found")]
    NotFound(String),
    /// A recording bitmap of a writable image, for a read-only export.
    #[error("Enabled bitmap '{0}' incompatible with readonly export")]
    EnabledOnReadOnly(String),
    /// A `{node, name}` bitmap the caller could not find (its text is QEMU's
    /// `block_dirty_bitmap_lookup`'s: `Node 'N' not found`, `Dirty bitmap 'B' not found`).
    #[error("{0}")]
    Lookup(String),
    /// The bitmap cannot be used (busy, inconsistent).
    #[error(transparent)]
    Unusable(#[from] BitmapError),
}

/// Finds bitmap `name` of block node `node` (the first argument, then the second), or says
/// why not in QEMU's words.
pub type BitmapLookup<'a> = &'a dyn Fn(&str, &str) -> Result<Arc<DirtyBitmap>, String>;

/// The bitmaps found for an export, in its order, and the holds that keep them busy.
#[derive(Debug, Default)]
pub(crate) struct ServedBitmaps {
    /// What the export serves, in order (context ids 2, 3, ...).
    pub(crate) bitmaps: Vec<Arc<DirtyBitmap>>,
    /// One hold per distinct bitmap, dropped when the export is removed (kept for its drop).
    pub(crate) _holds: Vec<BusyGuard>,
}

/// Who holds a bitmap found for an export.
enum Holder {
    /// The export's own image.
    Export,
    /// One of its backing nodes.
    Node(Arc<Image>),
    /// A backing file a qcow2 image of the chain opened from its header: read-only.
    BackingFile,
}

/// Bitmap `name` of `image`, or of the first of its backing layers (backing nodes, and the
/// backing files a qcow2 image opened from its header) that has one, as QEMU's
/// `nbd_export_create` looks down the chain.
fn find_down_the_chain(
    image: &Arc<Image>,
    name: &str,
) -> Result<Option<(Holder, Arc<DirtyBitmap>)>, ExportBitmapError> {
    let mut layer = Some(image.clone());
    while let Some(node) = layer {
        if let Some(bitmap) = node.dirty_bitmaps().get(name) {
            let holder = match Arc::ptr_eq(&node, image) {
                true => Holder::Export,
                false => Holder::Node(node),
            };
            return Ok(Some((holder, bitmap)));
        }
        let from_file = node
            .backing_file_bitmap(name)
            .map_err(|e| ExportBitmapError::Lookup(e.to_string()))?;
        if let Some(bitmap) = from_file {
            return Ok(Some((Holder::BackingFile, bitmap)));
        }
        layer = node.backing_node();
    }
    Ok(None)
}

/// Finds, checks and holds `wanted` for a `writable` (or read-only) export of `image`, whose
/// node is writable (`writable_node`) or not; `lookup` finds a `{node, name}` bitmap.
pub(crate) fn serve_bitmaps(
    wanted: &[NbdBitmapSpec],
    image: &Arc<Image>,
    (writable, writable_node): (bool, bool),
    lookup: BitmapLookup<'_>,
) -> Result<ServedBitmaps, ExportBitmapError> {
    let mut bitmaps = Vec::with_capacity(wanted.len());
    for w in wanted {
        let bitmap = match w {
            NbdBitmapSpec::Local(name) => {
                // The export's image, then down its backing nodes (a pull backup's scratch
                // image serves the disk's bitmap).
                let (holder, bitmap) = find_down_the_chain(image, name)?
                    .ok_or_else(|| ExportBitmapError::NotFound(name.clone()))?;
                // QEMU's `bdrv_is_writable` of the node holding it: neither read-only nor
                // inactive (the export's own node may be writable though its image is not).
                let holder_writable = match holder {
                    Holder::Export => (writable_node || !image.is_read_only()) && image.is_active(),
                    Holder::Node(below) => !below.is_read_only() && below.is_active(),
                    Holder::BackingFile => false,
                };
                if !writable && holder_writable && bitmap.is_recording() {
                    return Err(ExportBitmapError::EnabledOnReadOnly(name.clone()));
                }
                bitmap
            }
            NbdBitmapSpec::External { node, name } => {
                lookup(node, name).map_err(ExportBitmapError::Lookup)?
            }
        };
        bitmap.check_usable()?;
        bitmaps.push(bitmap);
    }
    let mut holds: Vec<BusyGuard> = Vec::with_capacity(bitmaps.len());
    for bitmap in &bitmaps {
        if holds.iter().any(|h| Arc::ptr_eq(h.bitmap(), bitmap)) {
            continue;
        }
        // Checked usable above, on this thread, with nothing between: it cannot be busy.
        holds.push(bitmap.hold_busy()?);
    }
    Ok(ServedBitmaps {
        bitmaps,
        _holds: holds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio_block::bitmap::BitmapOptions;
    use aio_block::ImageOptions;

    fn none(_: &str, name: &str) -> Result<Arc<DirtyBitmap>, String> {
        Err(format!("Dirty bitmap '{name}' not found"))
    }

    #[test]
    fn bitmaps_are_checked_in_order_and_held_only_when_all_pass() {
        let image = Arc::new(Image::null(1 << 20, ImageOptions::default()).unwrap());
        image.add_dirty_bitmap("on", BitmapOptions::new()).unwrap();
        image
            .add_dirty_bitmap("off", BitmapOptions::new().disabled(true))
            .unwrap();
        let local = |n: &str| NbdBitmapSpec::Local(n.to_owned());
        let e = serve_bitmaps(
            &[local("off"), local("gone")],
            &image,
            (false, false),
            &none,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "Bitmap 'gone' is not found");
        let e =
            serve_bitmaps(&[local("off"), local("on")], &image, (false, false), &none).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Enabled bitmap 'on' incompatible with readonly export"
        );
        // Nothing refused above was held.
        let off = image.dirty_bitmaps().get("off").unwrap();
        assert!(!off.is_busy());
        let external = NbdBitmapSpec::External {
            node: "n".into(),
            name: "x".into(),
        };
        let e = serve_bitmaps(&[external], &image, (true, false), &none).unwrap_err();
        assert_eq!(e.to_string(), "Dirty bitmap 'x' not found");
        let served = serve_bitmaps(
            &[local("on"), local("off"), local("on")],
            &image,
            (true, false),
            &none,
        )
        .unwrap();
        assert_eq!(served.bitmaps.len(), 3);
        assert_eq!(served._holds.len(), 2);
        assert!(off.is_busy());
        let e = serve_bitmaps(&[local("off")], &image, (true, false), &none).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Bitmap 'off' is currently in use by another operation and cannot be used"
        );
        drop(served);
        assert!(!off.is_busy());
    }
}
