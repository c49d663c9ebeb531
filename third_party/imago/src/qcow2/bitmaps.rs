//! Persistent dirty bitmaps (the bitmaps extension): the extension and the bitmap directory.
//!
//! qcow2 keeps persistent dirty bitmaps in a header extension (`docs/interop/qcow2.txt`,
//! "Bitmaps extension") that points to a bitmap directory; each directory entry names a bitmap,
//! its granularity, its flags (`in_use`, `auto`) and its bitmap table, whose entries point to
//! the clusters of its data (`bitmaps_data.rs`). The rules and limits are QEMU's
//! (`block/qcow2-bitmap.c`, `block/qcow2.c`), and so are the texts of the errors.
//!
//! * **Read at every open.** The extension and the directory are read and checked when the
//!   image is opened, read-only or writable; a corrupt extension or directory refuses the open,
//!   as QEMU refuses it. An extension found while the `bitmaps` autoclear bit is clear was left
//!   by a program that did not know it: its bitmaps are ignored (QEMU's "a program lacking
//!   bitmap support modified this file"), and a writable open drops it from the header.
//! * **In use while open for writing.** A writable open marks every bitmap `in_use` in place,
//!   then syncs, before any other write (QEMU's `update_ext_header_and_dir_in_place`): a
//!   bitmap that is not stored again (a crash, a program that does not track writes) stays
//!   inconsistent. [`Qcow2::bitmaps`](super::Qcow2::bitmaps) still tells the flags found.
//!
//! This module owns the extension's and the directory's on-disk layout, their checks, and the
//! in-place update of the directory's flags; never the bitmap tables or data, nor the storing
//! of a new directory (`bitmaps_data.rs`).

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
pub(super) const FLAG_IN_USE: u32 = 1 << 0;

/// Flag bit: the bitmap records writes (it is enabled).
pub(super) const FLAG_AUTO: u32 = 1 << 1;

/// Flag bits no version of the format defines.
const RESERVED_FLAGS: u32 = !(FLAG_IN_USE | FLAG_AUTO);

/// The only bitmap type: a dirty tracking bitmap.
const TYPE_DIRTY_TRACKING: u8 = 1;

/// QEMU's limit on the number of bitmaps in an image (`QCOW2_MAX_BITMAPS`).
pub(super) const MAX_BITMAPS: u32 = 65535;

/// QEMU's limit on the directory's size (`QCOW2_MAX_BITMAP_DIRECTORY_SIZE`).
pub(super) const MAX_DIRECTORY_SIZE: u64 = 1024 * MAX_BITMAPS as u64;

/// QEMU's limit on a bitmap table's entries (`BME_MAX_TABLE_SIZE`).
pub(super) const MAX_TABLE_SIZE: u64 = 0x800_0000;

/// QEMU's limit on a bitmap's data in bytes (`BME_MAX_PHYS_SIZE`).
pub(super) const MAX_PHYS_SIZE: u64 = 0x2000_0000;

/// The smallest granularity (log2) QEMU accepts.
pub const MIN_GRANULARITY_BITS: u8 = 9;

/// The largest granularity (log2) QEMU accepts.
pub const MAX_GRANULARITY_BITS: u8 = 31;

/// QEMU's longest bitmap name, in bytes.
pub const MAX_NAME_SIZE: usize = 1023;

/// A persistent dirty bitmap as the image's bitmap directory describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapEntry {
    /// Its name (UTF-8 as QEMU writes it; invalid bytes replaced).
    pub name: String,
    /// log2 of its granularity in bytes.
    pub granularity_bits: u8,
    /// Whether it was found `in_use`: not saved since it was last opened for writing, so its
    /// data cannot be trusted (QEMU loads it inconsistent).
    pub in_use: bool,
    /// Whether it records writes (`auto`: enabled).
    pub auto: bool,
    /// Host offset of its bitmap table.
    pub table_offset: u64,
    /// Number of entries of its bitmap table.
    pub table_size: u32,
    /// The entry's name bytes, exactly as on disk.
    pub(super) raw_name: Vec<u8>,
}

impl BitmapEntry {
    /// The flags field this entry has on disk.
    pub(super) fn flags(&self) -> u32 {
        (if self.in_use { FLAG_IN_USE } else { 0 }) | (if self.auto { FLAG_AUTO } else { 0 })
    }
}

/// The bitmaps extension's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Extension {
    /// Number of bitmaps.
    pub count: u32,
    /// Size of the directory in bytes.
    pub dir_size: u64,
    /// Host offset of the directory.
    pub dir_offset: u64,
}

impl Extension {
    /// The extension's data as the header stores it.
    pub fn serialize(&self) -> Vec<u8> {
        let mut data = Vec::with_capacity(EXTENSION_SIZE);
        data.extend_from_slice(&self.count.to_be_bytes());
        data.extend_from_slice(&0u32.to_be_bytes());
        data.extend_from_slice(&self.dir_size.to_be_bytes());
        data.extend_from_slice(&self.dir_offset.to_be_bytes());
        data
    }

    /// Parses and checks the extension's data (`qcow2_read_extensions`).
    fn parse(data: &[u8], cluster_size: u64) -> io::Result<Self> {
        if data.len() != EXTENSION_SIZE {
            return Err(invalid_data("bitmaps_ext: Invalid extension length"));
        }
        let u32_at = |o: usize| u32::from_be_bytes(data[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_be_bytes(data[o..o + 8].try_into().unwrap());
        let ext = Extension {
            count: u32_at(0),
            dir_size: u64_at(8),
            dir_offset: u64_at(16),
        };
        if u32_at(4) != 0 {
            return Err(invalid_data("bitmaps_ext: Reserved field is not zero"));
        }
        if ext.count > MAX_BITMAPS {
            return Err(invalid_data(format!(
                "bitmaps_ext: Image has {} bitmaps, exceeding the QEMU supported maximum of \
                 {MAX_BITMAPS}",
                ext.count
            )));
        }
        if ext.count == 0 {
            return Err(invalid_data("found bitmaps extension with zero bitmaps"));
        }
        if ext.dir_offset % cluster_size != 0 {
            return Err(invalid_data("bitmaps_ext: invalid bitmap directory offset"));
        }
        if ext.dir_size > MAX_DIRECTORY_SIZE {
            return Err(invalid_data(format!(
                "bitmaps_ext: bitmap directory size ({}) exceeds the maximum supported size \
                 ({MAX_DIRECTORY_SIZE})",
                ext.dir_size
            )));
        }
        Ok(ext)
    }
}

/// The bitmaps of an image: the extension and the directory as they are on disk now, and the
/// directory as the open found it.
#[derive(Debug, Clone, Default)]
pub(super) struct BitmapsState {
    /// The extension (None: no bitmaps, or ignored because the autoclear bit was clear).
    pub ext: Option<Extension>,
    /// The directory as it is on disk now.
    pub entries: Vec<BitmapEntry>,
    /// The directory as the open found it (before a writable open marked it `in_use`).
    pub found: Vec<BitmapEntry>,
}

/// The bytes of a bitmap's data for an image of `size` bytes at `granularity_bits`: QEMU's
/// serialization size (`hbitmap_serialization_size`), whole 64-bit words of bits.
pub(super) fn data_size(size: u64, granularity_bits: u8) -> u64 {
    let granules = size.div_ceil(1u64 << granularity_bits).max(1);
    granules.div_ceil(64) * 8
}

/// Checks a directory entry as QEMU's `check_dir_entry` does, for an image of `size` bytes.
pub(super) fn check_entry(
    e: &BitmapEntry,
    flags: u32,
    kind: u8,
    cluster_size: u64,
    size: u64,
) -> bool {
    let phys = e.table_size as u64 * cluster_size;
    let fail = e.table_size == 0
        || e.table_offset == 0
        || e.table_offset % cluster_size != 0
        || e.table_size as u64 > MAX_TABLE_SIZE
        || e.granularity_bits > MAX_GRANULARITY_BITS
        || e.granularity_bits < MIN_GRANULARITY_BITS
        || flags & RESERVED_FLAGS != 0
        || e.raw_name.len() > MAX_NAME_SIZE
        || kind != TYPE_DIRTY_TRACKING
        || phys > MAX_PHYS_SIZE;
    // A bitmap left in use after a resize may be too small; a consistent one may not.
    let too_small =
        flags & FLAG_IN_USE == 0 && (size as u128) > ((phys as u128 * 8) << e.granularity_bits);
    !fail && !too_small
}

/// The size a directory entry for a name of `name_len` bytes takes (8-byte aligned).
pub(super) fn entry_size(name_len: usize) -> usize {
    (ENTRY_HEADER_SIZE + name_len).next_multiple_of(8)
}

/// The directory holding `entries`, as it is stored.
pub(super) fn serialize_directory(entries: &[BitmapEntry]) -> Vec<u8> {
    let mut dir = Vec::new();
    for e in entries {
        let start = dir.len();
        dir.extend_from_slice(&e.table_offset.to_be_bytes());
        dir.extend_from_slice(&e.table_size.to_be_bytes());
        dir.extend_from_slice(&e.flags().to_be_bytes());
        dir.push(TYPE_DIRTY_TRACKING);
        dir.push(e.granularity_bits);
        dir.extend_from_slice(&(e.raw_name.len() as u16).to_be_bytes());
        dir.extend_from_slice(&0u32.to_be_bytes());
        dir.extend_from_slice(&e.raw_name);
        dir.resize(start + entry_size(e.raw_name.len()), 0);
    }
    dir
}

/// Parses and checks the directory `dir` that `ext` describes (`bitmap_list_load`).
fn parse_directory(
    dir: &[u8],
    ext: &Extension,
    cluster_size: u64,
    size: u64,
) -> io::Result<Vec<BitmapEntry>> {
    let broken = || invalid_data("Broken bitmap directory");
    let mut entries = Vec::new();
    let mut pos = 0usize;
    while pos < dir.len() {
        let head = dir.get(pos..pos + ENTRY_HEADER_SIZE).ok_or_else(broken)?;
        if entries.len() as u32 >= ext.count {
            return Err(invalid_data(
                "More bitmaps found than specified in header extension",
            ));
        }
        let flags = u32::from_be_bytes(head[12..16].try_into().unwrap());
        let name_size = u16::from_be_bytes(head[18..20].try_into().unwrap()) as usize;
        let extra_data_size = u32::from_be_bytes(head[20..24].try_into().unwrap()) as usize;
        let end = (ENTRY_HEADER_SIZE + name_size)
            .checked_add(extra_data_size)
            .map(|s| pos + s.next_multiple_of(8))
            .ok_or_else(broken)?;
        if end > dir.len() {
            return Err(broken());
        }
        let name_start = pos + ENTRY_HEADER_SIZE + extra_data_size;
        let raw_name = dir[name_start..name_start + name_size].to_vec();
        let name = String::from_utf8_lossy(&raw_name).into_owned();
        if extra_data_size != 0 {
            return Err(invalid_data("Bitmap extra data is not supported"));
        }
        let entry = BitmapEntry {
            name,
            granularity_bits: head[17],
            in_use: flags & FLAG_IN_USE != 0,
            auto: flags & FLAG_AUTO != 0,
            table_offset: u64::from_be_bytes(head[0..8].try_into().unwrap()),
            table_size: u32::from_be_bytes(head[8..12].try_into().unwrap()),
            raw_name,
        };
        if !check_entry(&entry, flags, head[16], cluster_size, size) {
            return Err(invalid_data(format!(
                "Bitmap '{}' doesn't satisfy the constraints",
                entry.name
            )));
        }
        entries.push(entry);
        pos = end;
    }
    if (entries.len() as u32) != ext.count {
        return Err(invalid_data(
            "Less bitmaps found than specified in header extension",
        ));
    }
    Ok(entries)
}

/// Reads the bitmaps extension's `data` and the directory it points to, for an image of
/// `size` bytes in clusters of `cluster_size`. `autoclear`: whether the `bitmaps` autoclear bit
/// is set (if not, the extension is ignored).
#[maybe_async]
pub(super) async fn load<S: Storage>(
    image: &S,
    data: Option<&[u8]>,
    autoclear: bool,
    cluster_size: u64,
    size: u64,
) -> io::Result<BitmapsState> {
    let Some(data) = data else {
        return Ok(BitmapsState::default());
    };
    let ext = Extension::parse(data, cluster_size)?;
    if !autoclear {
        return Ok(BitmapsState::default());
    }
    if ext.dir_size == 0 {
        return Err(invalid_data("Requested bitmap directory size is zero"));
    }
    let mut dir = vec![0u8; ext.dir_size as usize];
    image
        .read(&mut dir[..], ext.dir_offset)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("Failed to read bitmap directory: {e}")))?;
    let entries = parse_directory(&dir, &ext, cluster_size, size)?;
    Ok(BitmapsState {
        ext: Some(ext),
        found: entries.clone(),
        entries,
    })
}

/// Marks every bitmap of `state` (or, with `only`, those it names) `in_use`, in place, and
/// makes that durable.
///
/// Called on a writable open (every bitmap), and by aio-rs when a bitmap it keeps consistent
/// on disk stops being so (`only`). Returns the names of the bitmaps that were consistent
/// until now (those already `in_use` were inconsistent already and are left as they are).
/// Nothing is written when every bitmap is already `in_use`, so an image opened again loses
/// nothing more.
#[maybe_async]
pub(super) async fn mark_in_use<S: Storage>(
    image: &S,
    state: &mut BitmapsState,
    only: Option<&[&str]>,
) -> io::Result<Vec<String>> {
    let Some(ext) = state.ext else {
        return Ok(Vec::new());
    };
    let mut marked = Vec::new();
    let chosen =
        |e: &BitmapEntry| only.is_none_or(|names| names.iter().any(|n| n.as_bytes() == e.raw_name));
    for e in state.entries.iter_mut().filter(|e| !e.in_use && chosen(e)) {
        e.in_use = true;
        marked.push(e.name.clone());
    }
    if !marked.is_empty() {
        let dir = serialize_directory(&state.entries);
        debug_assert_eq!(dir.len() as u64, ext.dir_size);
        debug_assert!(dir.len() >= ENTRY_FLAGS_OFFSET);
        image.write(&dir[..], ext.dir_offset).await?;
        // Durable before any guest write: a write that lands while the flag is still clear on
        // disk would leave QEMU trusting a bitmap that missed it.
        image.sync().await?;
    }
    Ok(marked)
}
