//! Persistent dirty bitmaps (the bitmaps extension), kept intact by an image that does not
//! track them.
//!
//! imago does not update dirty bitmaps when it writes guest data. Clearing the `bitmaps`
//! autoclear bit on a writable open (what qcow2 prescribes for a program that does not know
//! the extension) makes QEMU drop every bitmap and report their clusters as leaked. Instead,
//! a writable open marks every bitmap `in_use` in the bitmap directory and keeps the bit: the
//! bitmaps stay in the image, QEMU reports them inconsistent (which they are, once imago has
//! written), and their clusters stay referenced. This is what QEMU itself does on a writable
//! open (`update_ext_header_and_dir_in_place`), except that imago never clears the flag again.
//!
//! This module owns the extension's on-disk layout and the in-place update of the directory's
//! flags; never the bitmaps' tables or data, which it does not read.

use super::metadata::HeaderExtension;
use crate::misc_helpers::invalid_data;
use crate::{Storage, StorageExt};
use maybe_async::maybe_async;
use std::io;

/// Header extension type of the bitmaps extension.
pub(super) const BITMAPS_EXTENSION: u32 = 0x2385_2875;

/// Size of the extension's data: `nb_bitmaps` (u32), reserved (u32),
/// `bitmap_directory_size` (u64), `bitmap_directory_offset` (u64).
const EXTENSION_SIZE: usize = 24;

/// Size of a directory entry's fixed part, before its extra data and name.
const ENTRY_HEADER_SIZE: usize = 24;

/// Offset of the `flags` field (u32) in a directory entry.
const ENTRY_FLAGS_OFFSET: usize = 12;

/// Flag bit: the bitmap was not saved since it was last opened for writing (inconsistent).
const FLAG_IN_USE: u32 = 1 << 0;

/// QEMU's limit on the number of bitmaps in an image.
const MAX_BITMAPS: u32 = 65535;

/// QEMU's limit on the directory's size.
const MAX_DIRECTORY_SIZE: u64 = 64 << 20;

/// Where the bitmap directory is, as the bitmaps extension says.
struct BitmapDirectory {
    /// Number of bitmaps.
    count: u32,
    /// Size of the directory in bytes.
    size: u64,
    /// Host offset of the directory.
    offset: u64,
}

impl BitmapDirectory {
    /// The directory named by the bitmaps extension among `extensions`, if there is one.
    fn find(extensions: &[HeaderExtension]) -> io::Result<Option<Self>> {
        let Some(data) = extensions.iter().find_map(|ext| match ext {
            HeaderExtension::Unknown {
                extension_type: BITMAPS_EXTENSION,
                data,
            } => Some(data),
            _ => None,
        }) else {
            return Ok(None);
        };
        if data.len() < EXTENSION_SIZE {
            return Err(invalid_data(format!(
                "Bitmaps extension too short ({} < {EXTENSION_SIZE} bytes)",
                data.len()
            )));
        }
        let u32_at = |o: usize| u32::from_be_bytes(data[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_be_bytes(data[o..o + 8].try_into().unwrap());
        let dir = BitmapDirectory {
            count: u32_at(0),
            size: u64_at(8),
            offset: u64_at(16),
        };
        if dir.count > MAX_BITMAPS {
            return Err(invalid_data(format!(
                "Too many bitmaps ({} > {MAX_BITMAPS})",
                dir.count
            )));
        }
        if dir.size > MAX_DIRECTORY_SIZE {
            return Err(invalid_data(format!(
                "Bitmap directory too large ({} > {MAX_DIRECTORY_SIZE} bytes)",
                dir.size
            )));
        }
        Ok(Some(dir))
    }
}

/// Marks every bitmap of the image `in_use`, in place, and makes that durable.
///
/// Called on a writable open while the `bitmaps` autoclear bit is set. Returns the names of
/// the bitmaps that were consistent until now (those already `in_use` were already
/// inconsistent and are left as they are). Nothing is written when every bitmap is already
/// `in_use`, so an image opened again loses nothing more.
#[maybe_async]
pub(super) async fn mark_in_use<S: Storage>(
    image: &S,
    extensions: &[HeaderExtension],
) -> io::Result<Vec<String>> {
    let Some(dir) = BitmapDirectory::find(extensions)? else {
        return Ok(Vec::new());
    };
    if dir.count == 0 || dir.size == 0 {
        return Ok(Vec::new());
    }

    let mut buf = vec![0u8; dir.size as usize];
    image.read(&mut buf[..], dir.offset).await?;

    let mut marked = Vec::new();
    let mut pos = 0usize;
    for _ in 0..dir.count {
        let entry = buf
            .get(pos..pos + ENTRY_HEADER_SIZE)
            .ok_or_else(|| invalid_data("Bitmap directory entry exceeds the directory"))?;
        let flags = u32::from_be_bytes(
            entry[ENTRY_FLAGS_OFFSET..ENTRY_FLAGS_OFFSET + 4]
                .try_into()
                .unwrap(),
        );
        let name_size = u16::from_be_bytes(entry[18..20].try_into().unwrap()) as usize;
        let extra_data_size = u32::from_be_bytes(entry[20..24].try_into().unwrap()) as usize;
        let name_start = pos + ENTRY_HEADER_SIZE + extra_data_size;
        let name = buf
            .get(name_start..name_start + name_size)
            .ok_or_else(|| invalid_data("Bitmap name exceeds the directory"))?;
        let name = String::from_utf8_lossy(name).into_owned();
        if flags & FLAG_IN_USE == 0 {
            let flags = (flags | FLAG_IN_USE).to_be_bytes();
            buf[pos + ENTRY_FLAGS_OFFSET..pos + ENTRY_FLAGS_OFFSET + 4].copy_from_slice(&flags);
            marked.push(name);
        }
        pos = (name_start + name_size).next_multiple_of(8);
    }

    if !marked.is_empty() {
        image.write(&buf[..], dir.offset).await?;
        // Durable before any guest write: a write that lands while the flag is still clear on
        // disk would leave QEMU trusting a bitmap that missed it.
        image.sync().await?;
    }
    Ok(marked)
}
