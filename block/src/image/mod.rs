//! An image open for serving: a raw file or block device (or a window of one), a qcow2 image
//! and its backing chain, or the null device; its size, its locks and its statistics.
//!
//! This module owns opening (`O_DIRECT`, the format rule of [`crate::format`], the locks of
//! [`crate::lock`] taken before anything is read), the size every user of the image shares,
//! and closing; what it is opened with, [`ImageOptions`], is `options.rs`'s. It never runs a request: that is [`ImageQueue`](crate::ImageQueue)'s, on the
//! context of whoever serves the image.
//!
//! * **One image, many users.** An [`Image`] is `Send + Sync` and lives in an `Arc`: every
//!   export serving it (each queue of a virtio-blk device, on whatever iothread, an NBD
//!   connection) shares its size, its locks and its counters.
//! * **A kind is a module.** Each kind of image (`raw.rs`, `null.rs`, the `qcow2` module) is
//!   a driver (`driver.rs`: its contract); one enum names them, and one macro dispatches to
//!   them, so a new kind (a network protocol) is a module, a variant and a line, not an edit
//!   of every match.
//! * **Nothing read before the lock.** The header is probed (4 KiB, which no lock forbids)
//!   to learn the access the format needs; the lock is taken before any other byte is read.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aio_core::engine::IoFile;

use crate::bitmap::{self, BitmapError, BitmapOptions, BitmapSet, DirtyBitmap};
use crate::format::{ImageFormat, KnownFormat};
use crate::lock::{Access, ImageLock};
use crate::stats::BlockStats;
use crate::status::Extent;

pub(crate) mod driver;
pub(crate) mod error;
pub(crate) mod file;
mod handoff;
pub(crate) mod hooks;
mod null;
mod options;
mod outside;
mod raw;
#[cfg(feature = "rbd")]
mod rbd;
#[cfg(feature = "rbd")]
mod rbd_open;
mod resize;
use driver::Driver;
pub use error::{ActivationError, BackingNodeError, OpenError, ResizeError};
use file::{open_direct, probe_header};
pub use options::ImageOptions;

/// The sector size image sizes and windows are counted in.
pub const SECTOR_SIZE: u64 = 512;

/// What an image's sectors are stored in: one variant per kind.
#[derive(Debug)]
pub(crate) enum Backing {
    /// A raw file or block device, or a window of one.
    Raw(raw::RawFile),
    /// Nothing: reads return zeros, writes are dropped.
    Null(null::NullImage),
    /// A qcow2 image and its backing chain.
    #[cfg(feature = "qcow2")]
    Qcow2(std::sync::Arc<crate::qcow2::Qcow2Image>),
    /// An RBD image in a Ceph cluster, served raw.
    #[cfg(feature = "rbd")]
    Rbd(rbd::RbdDisk),
}

/// `$body` with `$d` bound to the kind behind `$backing` (a [`Driver`]).
macro_rules! dispatch {
    ($backing:expr, $d:ident => $body:expr) => {
        match $backing {
            $crate::image::Backing::Raw($d) => $body,
            $crate::image::Backing::Null($d) => $body,
            #[cfg(feature = "qcow2")]
            $crate::image::Backing::Qcow2($d) => $body,
            #[cfg(feature = "rbd")]
            $crate::image::Backing::Rbd($d) => $body,
        }
    };
}
pub(crate) use dispatch;

/// An image open for serving. `Send + Sync`: shared (in an `Arc`) by every export and
/// iothread that serves it.
#[derive(Debug)]
pub struct Image {
    backing: Backing,
    path: PathBuf,
    /// The size in bytes: [`Image::resize`] changes it while the image is served.
    size: AtomicU64,
    options: ImageOptions,
    stats: BlockStats,
    /// Whether requests other than reads may run (false while inactive: `handoff.rs`).
    active: AtomicBool,
    /// Held by a transition between active and inactive (and by a resize), so that one runs
    /// at a time.
    transition: Mutex<()>,
    /// A dirty qcow2 image served read-only though the options asked for writes.
    dirty: bool,
    /// Its dirty bitmaps, which the request filter dirties.
    bitmaps: BitmapSet,
    /// Whether the persistent bitmaps were stored (a clean close).
    bitmaps_stored: AtomicBool,
    /// The copies made before its writes (a backup's: [`crate::block_copy`]).
    copy_hooks: hooks::CopyHooks,
    /// The node its unallocated areas read (QEMU's `backing=NODE`), and whether there is one
    /// (the one load a queue's change pays).
    backing_node: std::sync::RwLock<Option<Arc<Image>>>,
    has_backing_node: AtomicBool,
}

impl Drop for Image {
    fn drop(&mut self) {
        if let Err(e) = self.store_persistent_bitmaps() {
            eprintln!(
                "image {}: storing its persistent dirty bitmaps failed: {e}",
                self.path.display()
            );
        }
    }
}

/// A whole, positive number of sectors, or the error naming `path`.
fn check_size(path: &Path, bytes: u64) -> Result<u64, OpenError> {
    if bytes < SECTOR_SIZE || bytes % SECTOR_SIZE != 0 {
        return Err(OpenError::BadSize {
            path: path.to_path_buf(),
            bytes,
        });
    }
    Ok(bytes)
}

impl Image {
    fn new(backing: Backing, path: &Path, size: u64, options: ImageOptions) -> Self {
        Image {
            backing,
            path: path.to_path_buf(),
            size: AtomicU64::new(size),
            options,
            stats: BlockStats::default(),
            active: AtomicBool::new(true),
            transition: Mutex::new(()),
            dirty: false,
            bitmaps: BitmapSet::new(),
            bitmaps_stored: AtomicBool::new(false),
            copy_hooks: Default::default(),
            backing_node: Default::default(),
            has_backing_node: AtomicBool::new(false),
        }
    }

    /// Opens `path` (a file or a block device) with `O_DIRECT`, read-only when the options
    /// say so, as the format the options give (see [`ImageFormat`]), and reads its size.
    ///
    /// The image is locked first, as the options' `locking` and `share_rw` say (a qcow2
    /// image's backing files too, as they are opened): another process's use that conflicts
    /// is [`OpenError::Lock`], and nothing is read or written before the lock is held.
    pub fn open(path: &Path, options: ImageOptions) -> Result<Self, OpenError> {
        Self::open_as(path, options, false)
    }

    /// Opens `path` as [`open`](Self::open) does; `inactive`: without taking a lock, and
    /// without writing (`handoff.rs`).
    fn open_as(path: &Path, options: ImageOptions, inactive: bool) -> Result<Self, OpenError> {
        let open_error = |source| OpenError::Open {
            path: path.to_path_buf(),
            source,
        };
        let (file, bytes) = open_direct(path, !options.read_only).map_err(open_error)?;
        // The access is the format's (a qcow2 file never shares write), so the header is
        // probed before locking: a read of 4 KiB, which no lock forbids.
        let found = match options.format {
            ImageFormat::Raw => None,
            _ => probe_header(&file).map_err(open_error)?,
        };
        match (options.format, found) {
            (ImageFormat::Qcow2, _) | (ImageFormat::Auto, Some(KnownFormat::Qcow2)) => {
                return Self::open_qcow2(path, options, found, file, inactive);
            }
            (ImageFormat::Auto, Some(format)) => {
                return Err(OpenError::FormatFound {
                    path: path.to_path_buf(),
                    format,
                })
            }
            _ => {}
        }
        let access = Access::disk(!options.read_only, options.share_rw);
        let lock = match inactive {
            true => None,
            false => Some(ImageLock::acquire(&file, path, access, options.locking)?),
        };
        let raw = raw::RawFile::whole(IoFile::new(file), options.format == ImageFormat::Auto, lock);
        let size = check_size(path, bytes)?;
        Ok(Self::new(Backing::Raw(raw), path, size, options))
    }

    /// Opens the qcow2 image whose file is `file` (opened for the probe, locked here first).
    /// A dirty image (lazy refcounts after a crash) is served read-only, whatever the options
    /// asked: [`is_dirty`](Self::is_dirty) says so, for the caller to warn. `inactive`: read-only
    /// and unlocked until activated (a dirty image is then refused writes).
    #[cfg(feature = "qcow2")]
    fn open_qcow2(
        path: &Path,
        mut options: ImageOptions,
        _found: Option<KnownFormat>,
        file: std::fs::File,
        inactive: bool,
    ) -> Result<Self, OpenError> {
        if inactive {
            drop(file);
            let qcow2 = crate::qcow2::Qcow2Image::open_inactive(path, options.open_backing)?;
            let size = check_size(path, qcow2.size())?;
            let backing = Backing::Qcow2(std::sync::Arc::new(qcow2));
            return Ok(Self::new(backing, path, size, options));
        }
        let dirty = !options.read_only && crate::qcow2::is_dirty(path);
        if dirty {
            options.read_only = true;
        }
        let access = Access::qcow2_file(!options.read_only);
        let lock = ImageLock::acquire(&file, path, access, options.locking)?;
        drop(file);
        let qcow2 =
            crate::qcow2::Qcow2Image::open(path, !options.read_only, lock, options.open_backing)?;
        let size = check_size(path, qcow2.size())?;
        let backing = Backing::Qcow2(std::sync::Arc::new(qcow2));
        let mut image = Self::new(backing, path, size, options);
        image.dirty = dirty;
        image.load_persistent_bitmaps()?;
        Ok(image)
    }

    #[cfg(not(feature = "qcow2"))]
    fn open_qcow2(
        path: &Path,
        _options: ImageOptions,
        found: Option<KnownFormat>,
        _file: std::fs::File,
        _inactive: bool,
    ) -> Result<Self, OpenError> {
        Err(match found {
            Some(KnownFormat::Qcow2) => OpenError::FormatNotBuilt {
                path: path.to_path_buf(),
                format: KnownFormat::Qcow2,
            },
            found => OpenError::NotQcow2 {
                path: path.to_path_buf(),
                found,
            },
        })
    }

    /// An image of `size` bytes with nothing behind it: reads return zeros, writes, flushes,
    /// discards and write-zeroes succeed and keep nothing (QEMU's `null-co` with
    /// `read-zeroes=on`). It measures an export's own cost.
    pub fn null(size: u64, options: ImageOptions) -> Result<Self, OpenError> {
        let path = Path::new("null");
        let size = check_size(path, size)?;
        Ok(Self::new(
            Backing::Null(null::NullImage),
            path,
            size,
            options,
        ))
    }

    /// An image that is a window of a file already open (`O_DIRECT`, with the access the
    /// options need): `size` bytes from `offset`, as QEMU's raw driver's `offset=` and
    /// `size=` serve part of a file or device. Both are whole sectors; the format is not
    /// probed (the window is raw by construction), and no lock is taken: the file is the
    /// caller's, to lock with [`ImageLock`] as it sees fit.
    pub fn window(
        file: IoFile,
        offset: u64,
        size: u64,
        options: ImageOptions,
    ) -> Result<Self, OpenError> {
        if size < SECTOR_SIZE || size % SECTOR_SIZE != 0 || offset % SECTOR_SIZE != 0 {
            return Err(OpenError::BadWindow { offset, size });
        }
        let raw = raw::RawFile::window(file, offset);
        Ok(Self::new(
            Backing::Raw(raw),
            Path::new("window"),
            size,
            options,
        ))
    }

    /// What stores the sectors (for the request path).
    /// Makes `node` (None: none) the image this one's unallocated areas read, as QEMU's
    /// qcow2 `backing=NODE` does: a qcow2 image opened without its backing file
    /// ([`ImageOptions::open_backing`] false). What the node caches is seen (it is read
    /// through, never opened again), a backup copying it into this image gives reads its
    /// start's bytes (the fleecing rule, [`crate::block_copy`]), and the image takes no
    /// changes from its queues while a node backs it.
    pub fn set_backing_node(&self, node: Option<Arc<Image>>) -> Result<(), BackingNodeError> {
        let mut below = node.clone();
        while let Some(n) = below {
            if std::ptr::eq(&*n, self) {
                return Err(BackingNodeError::Loop);
            }
            below = n.backing_node();
        }
        let lent = node.clone().map(|n| n as Arc<dyn hooks::BackingNode>);
        dispatch!(&self.backing, d => d.set_backing_node(lent))?;
        self.has_backing_node
            .store(node.is_some(), Ordering::Release);
        *self.backing_node.write().unwrap_or_else(|e| e.into_inner()) = node;
        Ok(())
    }

    /// The backing node attached ([`set_backing_node`](Self::set_backing_node)), if any.
    pub fn backing_node(&self) -> Option<Arc<Image>> {
        if !self.has_backing_node.load(Ordering::Acquire) {
            return None;
        }
        self.backing_node
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether a backing node is attached (one atomic load).
    pub(crate) fn has_backing_node(&self) -> bool {
        self.has_backing_node.load(Ordering::Acquire)
    }

    /// Which image this is, as its kind names itself ([`hooks::KindId`]).
    pub(crate) fn kind_id(&self) -> hooks::KindId {
        match &self.backing {
            #[cfg(feature = "qcow2")]
            Backing::Qcow2(q) => Arc::as_ptr(q) as usize,
            _ => self as *const Image as usize,
        }
    }

    pub(crate) fn copy_hooks(&self) -> &hooks::CopyHooks {
        &self.copy_hooks
    }

    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The file the image was opened from (`"null"` for the null device, `"window"` for a
    /// window).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the image's byte 0 is in its file (0 unless a [`window`](Self::window), and for
    /// an image that is not a raw file).
    pub fn offset(&self) -> u64 {
        match &self.backing {
            Backing::Raw(raw) => raw.offset(),
            _ => 0,
        }
    }

    /// The raw image's file, for requests of its own: None for an image that is not a raw
    /// file or block device (a qcow2 image, the null device).
    pub fn file(&self) -> Option<&IoFile> {
        match &self.backing {
            Backing::Raw(raw) => Some(raw.file()),
            _ => None,
        }
    }

    /// What is served: `"raw"`, `"qcow2"` or `"null"`.
    pub fn format_name(&self) -> &'static str {
        dispatch!(&self.backing, d => d.format_name())
    }

    /// The backing files of a qcow2 image, nearest first (empty for any other image).
    pub fn backing_chain(&self) -> &[PathBuf] {
        dispatch!(&self.backing, d => d.backing_chain())
    }

    /// The persistent dirty bitmaps of a qcow2 image (libvirt's backup checkpoints) that
    /// opening it writable marked `in_use` in the file, by name; empty for any other open.
    ///
    /// A writable open marks each bitmap `in_use` first (QEMU's rule while a bitmap may miss
    /// writes), then keeps the consistent ones consistent in the file while it is open
    /// (`qcow2/bitmaps.rs`: stored again with `in_use` clear, every write's granules written
    /// before the write runs): those are not listed. What is listed stays `in_use`: bitmaps
    /// found `in_use` already are not listed again, and an image whose bitmaps cannot be
    /// written in place (RBD) lists them all; `qemu-img info` shows them `in-use`, QEMU reports
    /// them inconsistent, `qemu-img check` finds nothing leaked, and `qemu-img bitmap --remove`
    /// can remove them.
    ///
    /// An image opened [inactive](Self::open_inactive) marks them when it is
    /// [activated](Self::activate) writable: each activation adds those it marked.
    pub fn bitmaps_marked_inconsistent(&self) -> Vec<String> {
        dispatch!(&self.backing, d => d.bitmaps_marked_inconsistent())
    }

    /// Writes what the image caches (a qcow2 image's metadata) and syncs its files; a raw
    /// image and the null device have nothing cached. A stopping server calls it after its
    /// exports have stopped (dropping the image does it too).
    ///
    /// A writable qcow2 image first stores its persistent dirty bitmaps (those not
    /// inconsistent, `in_use` cleared) and removes from the file those removed from the image
    /// ([`crate::bitmap`]); dropping the image does it too, once.
    pub fn close(&self) -> io::Result<()> {
        self.store_persistent_bitmaps()?;
        dispatch!(&self.backing, d => d.close())
    }

    /// Stores the persistent dirty bitmaps in the image (a writable qcow2 image; nothing
    /// elsewhere), once: after that, the image is closing.
    pub fn store_persistent_bitmaps(&self) -> io::Result<()> {
        if !self.active.load(Ordering::Acquire) || self.options.read_only {
            return Ok(());
        }
        if self.bitmaps_stored.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        dispatch!(&self.backing, d => d.store_bitmaps(&self.bitmaps))
    }

    /// Loads the image's persistent dirty bitmaps into its set (qcow2).
    fn load_persistent_bitmaps(&self) -> Result<(), OpenError> {
        let size = self.size();
        let read_only = self.options.read_only;
        let loaded =
            dispatch!(&self.backing, d => d.load_bitmaps(size, read_only)).map_err(|source| {
                OpenError::Image {
                    path: self.path.clone(),
                    source,
                }
            })?;
        let mut kept = Vec::new();
        for bitmap in loaded {
            let bitmap = Arc::new(bitmap);
            // The directory has no duplicate name QEMU would accept; keep the first.
            if self.bitmaps.insert(bitmap.clone()).is_ok() {
                kept.push(bitmap);
            }
        }
        if !read_only {
            // Consistent on disk from now on, through crashes (`qcow2/durable.rs`); if that
            // fails they stay marked in use, as QEMU leaves them, and are stored at the clean
            // close.
            if let Err(e) = dispatch!(&self.backing, d => d.keep_bitmaps(&kept)) {
                eprintln!(
                    "image {}: persistent bitmaps stay in use (inconsistent after a crash): {e}",
                    self.path.display()
                );
            }
        }
        Ok(())
    }

    /// Makes the granules of `[offset, offset + len)` durable in the persistent bitmaps the
    /// image keeps on disk, before a change of that range runs (the request filter's, on the
    /// submitting thread; blocking once per run of 64 granules first dirtied since the open,
    /// else an atomic load per bitmap word: `qcow2/durable.rs`).
    pub(crate) fn bitmaps_before_write(&self, offset: u64, len: u64) -> io::Result<()> {
        dispatch!(&self.backing, d => d.bitmaps_before_write(offset, len))
    }

    /// Block status: which parts of `[offset, offset + len)` hold data and which are holes
    /// that read as zeros, as QEMU's `bdrv_co_block_status` answers `qemu-img map` and NBD's
    /// `base:allocation`. The extents cover the range in order, neighbours of one kind merged;
    /// past the image's end is a hole.
    ///
    /// * raw: the file's (`SEEK_DATA` / `SEEK_HOLE`; all data where the file system cannot
    ///   tell);
    /// * qcow2: the mapping (unallocated and zero clusters are holes, backing files resolved;
    ///   a mapped cluster is data, as QEMU reports it, even over a hole of its file);
    /// * null: all holes (it reads zeros and stores nothing).
    ///
    /// Blocking (`lseek`; a qcow2 image reads metadata it has not cached, and waits for its
    /// lock, which a discard holds alone): call it from a thread that runs none of this
    /// image's requests, or offload it (`aio_pool::PoolContext::run`).
    pub fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        dispatch!(&self.backing, d => d.block_status(offset, len, self.size()))
    }

    /// The size in bytes (now: [`resize`](Self::resize) changes it).
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Whether the image is a dirty qcow2 image (its refcounts stale after a crash with
    /// `lazy_refcounts=on`) served read-only though the options asked for writes, as QEMU
    /// serves one it opens read-only; `qemu-img check -r all` repairs it. The options then
    /// say `read_only`.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether writes, discards, write-zeroes and resizes are refused.
    pub fn is_read_only(&self) -> bool {
        self.options.read_only
    }

    /// The options it was opened with (`read_only` set for a [dirty](Self::is_dirty) image).
    pub fn options(&self) -> &ImageOptions {
        &self.options
    }

    /// The image's I/O statistics (QEMU's `query-blockstats`), counted by its exports.
    pub fn stats(&self) -> &BlockStats {
        &self.stats
    }

    /// Its dirty bitmaps ([`crate::bitmap`]).
    pub fn dirty_bitmaps(&self) -> &BitmapSet {
        &self.bitmaps
    }

    /// Persistent bitmap `name` of the nearest backing file this image opened from its
    /// header (a qcow2 image's backing chain, not a backing node) that has one, read from
    /// that file now. Read-only: a backing file is opened read-only and locked against
    /// writers, so its bits stay as they are while this image is open; it is in no set (QEMU
    /// keeps it on the backing file's own node, which this image does not expose). `None`
    /// when no backing file has it; an error when it cannot be read.
    pub fn backing_file_bitmap(&self, name: &str) -> io::Result<Option<Arc<DirtyBitmap>>> {
        let found = dispatch!(&self.backing, d => d.backing_file_bitmap(name))?;
        Ok(found.map(Arc::new))
    }

    /// The cluster size of an image that has one (qcow2), which a dirty bitmap's default
    /// granularity follows.
    pub fn cluster_size(&self) -> Option<u64> {
        dispatch!(&self.backing, d => d.cluster_size())
    }

    /// Adds a dirty bitmap named `name` over the whole image (`block-dirty-bitmap-add`): the
    /// granularity the options give, or QEMU's default for this image
    /// ([`bitmap::default_granularity`]). A persistent one is refused on an image that
    /// cannot store it.
    pub fn add_dirty_bitmap(
        &self,
        name: &str,
        options: BitmapOptions,
    ) -> Result<Arc<DirtyBitmap>, BitmapError> {
        let bitmap = self.new_dirty_bitmap(name, options)?;
        self.insert_dirty_bitmap(bitmap.clone())?;
        Ok(bitmap)
    }

    /// Adds `bitmap` (made by [`new_dirty_bitmap`](Self::new_dirty_bitmap)) to the image's
    /// set, refused if its name is taken. A persistent one is stored at once and kept
    /// consistent on disk from then on (`qcow2/durable.rs`); if that fails it is stored at
    /// the clean close only, as QEMU stores it, and the failure is said on stderr.
    pub fn insert_dirty_bitmap(&self, bitmap: Arc<DirtyBitmap>) -> Result<(), BitmapError> {
        self.bitmaps.insert(bitmap.clone())?;
        if bitmap.is_persistent() {
            if let Err(e) =
                dispatch!(&self.backing, d => d.keep_bitmaps(std::slice::from_ref(&bitmap)))
            {
                eprintln!(
                    "image {}: bitmap '{}' is stored at the clean close only: {e}",
                    self.path.display(),
                    bitmap.name()
                );
            }
        }
        Ok(())
    }

    /// Makes the bitmap [`add_dirty_bitmap`](Self::add_dirty_bitmap) would add, with the same
    /// checks but for the name being taken, without adding it: a transaction stages it, and
    /// adds it with [`insert_dirty_bitmap`](Self::insert_dirty_bitmap) when it commits.
    pub fn new_dirty_bitmap(
        &self,
        name: &str,
        options: BitmapOptions,
    ) -> Result<Arc<DirtyBitmap>, BitmapError> {
        let granularity = bitmap::default_granularity(self.cluster_size());
        let storable = dispatch!(&self.backing, d => d.stores_bitmaps());
        let node = self.path.display().to_string();
        BitmapSet::make(name, (self.size(), granularity), options, (storable, &node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QED header is refused by default, naming the format, and served with `format=raw`;
    /// a raw image opens either way.
    #[test]
    fn an_image_with_another_formats_header_opens_only_as_raw_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (qed, raw) = (dir.path().join("x.qed"), dir.path().join("x.img"));
        let mut bytes = vec![0u8; 64 << 10];
        bytes[..4].copy_from_slice(b"QED\0");
        std::fs::write(&qed, &bytes).unwrap();
        std::fs::write(&raw, vec![0u8; 64 << 10]).unwrap();
        let e = Image::open(&qed, ImageOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                OpenError::FormatFound {
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
        let image = Image::open(&qed, ImageOptions::new(ImageFormat::Raw)).unwrap();
        assert_eq!(image.size(), 64 << 10);
        assert_eq!(image.format_name(), "raw");
        Image::open(&raw, ImageOptions::default()).unwrap();
    }

    #[test]
    fn sizes_and_windows_are_whole_sectors() {
        let e = Image::null(1000, ImageOptions::default()).unwrap_err();
        assert!(matches!(e, OpenError::BadSize { bytes: 1000, .. }), "{e}");
        let f = tempfile::tempfile().unwrap();
        let e = Image::window(IoFile::new(f), 100, 4096, ImageOptions::default()).unwrap_err();
        assert!(matches!(e, OpenError::BadWindow { .. }), "{e}");
    }
}
