//! qcow2 images served through `imago`: a qcow2 image and its backing chain, on aio-rs's
//! engines.
//!
//! This module owns opening an image (its header checked first, the chain followed read-only,
//! loops and refused formats named), the lock that lets a discard change mappings no request
//! is using, and the final flush. The storage under it is `storage.rs`, the per-request engine
//! `current.rs`, a request's ops `requests.rs`, the direct path for clusters the image owns
//! `direct.rs`; the raw path never comes here.
//!
//! * **One image, many iothreads.** The image is `Send + Sync`: queues on several iothreads
//!   serve it at once. Reads, writes, flushes and write-zeroes share it; a discard (and a
//!   write-zeroes that unmaps) takes it alone, since freeing clusters may change mappings a
//!   concurrent request holds (imago's rule for `discard_to_*`).
//! * **Metadata is the image's.** A flush writes imago's cached metadata and syncs every
//!   file; dropping the image (or [`Qcow2Image::close`]) flushes it, so a stop leaves
//!   `qemu-img check` clean.
//! * **Opened again on activation.** An image opened inactive is opened read-only by imago,
//!   without locks; inactivating one writes its metadata back and opens it so; activating one
//!   takes its locks and opens it anew, writable if asked, so that what another process wrote
//!   meanwhile is seen (`reopen.rs`). The opening is swapped under the image's lock, which
//!   every request already holds: the request path pays nothing for it.
//! * **A killed daemon loses no completed write.** A write that allocates (and a discard or
//!   write-zeroes) completes only after the cached metadata is written back to the file (not
//!   synced), one write-back for all the requests waiting when it begins (a group commit):
//!   imago's cache alone, killed, left fio's data unreadable and `qemu-img check` failing.

mod bitmaps;
mod blocking;
mod cache;
pub(crate) mod current;
mod direct;
mod durable;
mod file_storage;
mod node_backing;
mod node_slot;
#[cfg(feature = "rbd")]
mod rbd_storage;
mod reopen;
mod requests;
mod settle;
mod source;
mod status;
mod storage;
mod write_back;

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use imago::format::gate::ImplicitOpenGate;
use imago::format::Format;
use imago::qcow2::Qcow2;
use imago::{FormatAccess, FormatDriverBuilder, StorageOpenOptions};
use tokio::sync::RwLock;

use crate::lock::{Access, ImageLock, LockMode};

use storage::EngineStorage;

use crate::format::{self, KnownFormat, Qcow2Refusal};
use crate::image::error::OpenError;

/// The longest backing chain followed (QEMU has no fixed limit; a chain this long is a loop
/// the path check missed, or a mistake).
const MAX_CHAIN: usize = 64;

/// A qcow2 image open for serving.
pub(crate) struct Qcow2Image {
    /// The current opening, shared with the direct path's requests, which hold it until their
    /// completion; replaced (held alone) when the image is inactivated or activated.
    access: Arc<RwLock<Opened>>,
    /// The clusters the direct path may serve (`direct.rs`).
    cache: cache::MappingCache,
    path: PathBuf,
    /// The backing files opened, nearest first.
    chain: Vec<PathBuf>,
    /// The persistent dirty bitmaps the writable openings marked `in_use` (imago's
    /// `bitmaps.rs`).
    bitmaps_marked_inconsistent: Mutex<Vec<String>>,
    /// Whether the current opening writes (false while inactive): only then does a drop
    /// write the metadata back.
    writable: AtomicBool,
    /// The metadata write-back allocating writes wait for.
    write_back: write_back::WriteBack,
    /// The image's lock and its backing files' (QEMU's lock bytes), held while it is served
    /// active; none while inactive.
    locks: Mutex<Vec<ImageLock>>,
    /// Where the image is stored, to open it again.
    source: source::Source,
    /// Its cluster size (`1 << cluster_bits`), which an opening again must find unchanged.
    cluster_bits: u32,
    /// The persistent bitmaps kept consistent in the file while it is open (`durable.rs`).
    durable: Arc<durable::DurableBitmaps>,
    /// The block node its unallocated clusters are read from, when its backing is a node
    /// (`node_slot.rs`, read through by `node_backing.rs`), and whether the header's backing file is opened instead.
    node_backing: node_slot::NodeBacking,
}

/// One opening of the image by imago: its metadata as read then, and the file the direct
/// path's clusters are in. Reads through it as imago's `FormatAccess`.
pub(crate) struct Opened {
    format: FormatAccess<EngineStorage>,
    /// The file of this opening the mapping cache's clusters are in.
    data_file: cache::DataFile,
}

impl Deref for Opened {
    type Target = FormatAccess<EngineStorage>;
    fn deref(&self) -> &Self::Target {
        &self.format
    }
}

impl DerefMut for Opened {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.format
    }
}

/// What opening the image's metadata gave (`open_format`).
struct Opening {
    opened: Opened,
    chain: Vec<PathBuf>,
    bitmaps: Vec<String>,
    /// The backing files' locks, taken through the gate.
    locks: Vec<ImageLock>,
    /// The image's file, where it is one (not RBD).
    file: Option<aio_core::engine::IoFile>,
    /// Whether the header's backing file was opened.
    opens_backing: bool,
}

impl fmt::Debug for Qcow2Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qcow2Image")
            .field("path", &self.path)
            .field("chain", &self.chain)
            .field("writable", &self.writable.load(Ordering::Relaxed))
            .finish()
    }
}

/// Reads the first 4 KiB of `path` (or all of it, if smaller).
fn read_header(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)?
        .take(4096)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// The big-endian field of `len` bytes at `at` of a header, if the header is that long.
fn header_field(head: &[u8], at: usize, len: usize) -> Option<u64> {
    head.get(at..at + len)
        .map(|b| b.iter().fold(0u64, |v, &byte| (v << 8) | u64::from(byte)))
}

/// The most memory an image's L2 cache may take: 32 MiB, QEMU's default `l2-cache-size`
/// limit (the tables of 256 GiB of disk at 64 KiB clusters).
const L2_CACHE_MAX_BYTES: u64 = 32 << 20;

/// How many L2 tables to cache for the qcow2 image whose header is `head` (already checked):
/// enough for the whole disk, as QEMU's default cache does, within [`L2_CACHE_MAX_BYTES`], and
/// never fewer than imago's default. A table not cached is loaded (a cluster read and parsed)
/// before the request that needs it, so a disk whose tables do not fit serves random requests
/// at a fraction of the speed (measured at 256 GiB with imago's default of 128 tables, 64
/// GiB: 0.06 of raw).
fn l2_cache_entries(head: &[u8]) -> usize {
    let (Some(cluster_bits), Some(size)) = (header_field(head, 20, 4), header_field(head, 24, 8))
    else {
        return imago::qcow2::DEFAULT_L2_CACHE_ENTRIES;
    };
    let cluster = 1u64 << cluster_bits.min(31);
    let covered_by_one = cluster * (cluster / 8);
    let needed = size.div_ceil(covered_by_one);
    let most = (L2_CACHE_MAX_BYTES / cluster).max(1);
    let entries = needed.min(most) as usize;
    entries.max(imago::qcow2::DEFAULT_L2_CACHE_ENTRIES)
}

/// Checks that `path` holds a qcow2 image that may be served (a dirty one only read-only).
fn check_qcow2_header(path: &Path, head: &[u8], writable: bool) -> Result<(), OpenError> {
    match format::probe(head) {
        Some(KnownFormat::Qcow2) => match format::check_qcow2(head) {
            Err(Qcow2Refusal::Dirty) if !writable => Ok(()),
            checked => checked.map_err(|reason| OpenError::Qcow2Refused {
                path: path.to_path_buf(),
                reason,
            }),
        },
        found => Err(OpenError::NotQcow2 {
            path: path.to_path_buf(),
            found,
        }),
    }
}

/// The gate every file of the chain is opened through: read-only backing layers, their headers
/// checked, no loops, no endless chains. A refusal is kept typed for the caller (imago turns
/// what the gate returns into an `io::Error` with context).
#[derive(Clone)]
struct ChainGate {
    /// Canonical paths opened so far, the image first.
    seen: Rc<RefCell<Vec<PathBuf>>>,
    /// Backing layers opened, nearest first.
    chain: Rc<RefCell<Vec<PathBuf>>>,
    refusal: Rc<RefCell<Option<OpenError>>>,
    /// How backing files are locked (the image's `locking=`), and their locks once taken.
    locking: LockMode,
    locks: Rc<RefCell<Vec<ImageLock>>>,
    /// Whether the backing file the header names is opened (false: the backing is a node,
    /// attached after, or none).
    open_backing: bool,
}

impl ChainGate {
    fn new(locking: LockMode, open_backing: bool) -> Self {
        ChainGate {
            seen: Rc::default(),
            chain: Rc::default(),
            refusal: Rc::default(),
            locking,
            locks: Rc::default(),
            open_backing,
        }
    }

    fn refuse(&self, e: OpenError) -> io::Error {
        let text = e.to_string();
        self.refusal.borrow_mut().get_or_insert(e);
        io::Error::new(io::ErrorKind::InvalidData, text)
    }

    /// Records `path` as opened, refusing a loop or an overlong chain.
    fn visit(&self, path: &Path) -> io::Result<()> {
        let canonical = std::fs::canonicalize(path)?;
        let mut seen = self.seen.borrow_mut();
        if seen.contains(&canonical) || seen.len() >= MAX_CHAIN {
            drop(seen);
            return Err(self.refuse(OpenError::BackingLoop {
                path: path.to_path_buf(),
            }));
        }
        seen.push(canonical);
        Ok(())
    }
}

impl ImplicitOpenGate<EngineStorage> for ChainGate {
    async fn open_format<F: FormatDriverBuilder<EngineStorage>>(
        &mut self,
        builder: F,
    ) -> io::Result<FormatAccess<EngineStorage>> {
        // A backing layer: its header is checked as the image's was (a raw backing file must
        // not be another format, a qcow2 one must be servable).
        if let Some(path) = builder.get_image_path() {
            let head = read_header(&path)?;
            let refused = match F::FORMAT {
                Format::Qcow2 => check_qcow2_header(&path, &head, false).err(),
                _ => format::probe(&head).map(|format| OpenError::BackingFormat {
                    path: path.clone(),
                    format,
                }),
            };
            if let Some(e) = refused {
                return Err(self.refuse(e));
            }
            self.chain.borrow_mut().push(path);
        }
        let layer = Box::pin(builder.write(false).open(self.clone())).await?;
        Ok(FormatAccess::new(layer))
    }

    async fn open_storage(&mut self, opts: StorageOpenOptions) -> io::Result<EngineStorage> {
        let path = opts
            .get_filename()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name given"))?
            .to_path_buf();
        self.visit(&path)?;
        let storage = EngineStorage::open_path(&path, opts.get_writable())?;
        // A backing file is locked as QEMU's tools lock one (read, everything shared) before
        // imago reads its header through it.
        let file = storage.io_file().ok_or(io::ErrorKind::Unsupported)?;
        let fd = file.as_fd().try_clone_to_owned()?;
        match ImageLock::acquire(&fd.into(), &path, Access::backing(), self.locking) {
            Ok(lock) => self.locks.borrow_mut().push(lock),
            Err(e) => return Err(self.refuse(e.into())),
        }
        Ok(storage)
    }
}

/// The cluster bits of a checked header (qcow2's are 9..=21).
fn cluster_bits(head: &[u8]) -> u32 {
    header_field(head, 20, 4).unwrap_or(16) as u32
}

/// Opens the image on `storage` (its header `head` checked) through `gate`, for writing when
/// `writable`: imago reads its metadata (and, writable, marks its bitmaps `in_use`).
fn open_format(
    path: &Path,
    head: &[u8],
    storage: EngineStorage,
    writable: bool,
    gate: ChainGate,
) -> Result<Opening, OpenError> {
    let file = storage.io_file().cloned();
    let mut builder = Qcow2::<EngineStorage>::builder(storage)
        .l2_cache_entries(l2_cache_entries(head))
        .write(writable);
    if !gate.open_backing {
        builder = builder.backing(None);
    }
    let opened = current::block_on(builder.open(gate.clone()));
    let qcow2 = match opened {
        Ok(q) => q,
        Err(source) => {
            return Err(gate.refusal.take().unwrap_or_else(|| OpenError::Image {
                path: path.to_path_buf(),
                source,
            }))
        }
    };
    let bitmaps = qcow2.bitmaps_marked_in_use().to_vec();
    let locks = std::mem::take(&mut *gate.locks.borrow_mut());
    Ok(Opening {
        opened: Opened {
            format: FormatAccess::new(qcow2),
            data_file: cache::DataFile::default(),
        },
        chain: gate.chain.take(),
        bitmaps,
        locks,
        file,
        opens_backing: gate.open_backing,
    })
}

/// Whether the qcow2 image at `path` is dirty (and nothing else is refused): its refcounts
/// stale after a crash with `lazy_refcounts=on`, so it is served read-only.
pub(crate) fn is_dirty(path: &Path) -> bool {
    read_header(path).is_ok_and(|head| format::check_qcow2(&head) == Err(Qcow2Refusal::Dirty))
}

impl Qcow2Image {
    /// Opens the qcow2 image at `path` (for writing when `writable`) and its backing chain
    /// (read-only), after checking every header. `lock` is the image's own, taken by the
    /// caller before anything was read; the backing files are locked as its mode says.
    pub(crate) fn open(
        path: &Path,
        writable: bool,
        lock: ImageLock,
        open_backing: bool,
    ) -> Result<Self, OpenError> {
        let mode = match lock.is_locked() {
            true => LockMode::Auto,
            false => LockMode::Off,
        };
        let (head, opening) = Self::open_file(path, writable, mode, open_backing)?;
        Self::new(
            path,
            &head,
            opening,
            source::Source::File,
            vec![lock],
            writable,
        )
    }

    /// Opens the qcow2 image at `path` inactive: read-only, its backing chain too, without a
    /// lock of its own or of its backing files' and without writing a byte (another process
    /// may own it). [`activate`](Self::activate) opens it again with its locks.
    pub(crate) fn open_inactive(path: &Path, open_backing: bool) -> Result<Self, OpenError> {
        let (head, opening) = Self::open_file(path, false, LockMode::Off, open_backing)?;
        Self::new(path, &head, opening, source::Source::File, vec![], false)
    }

    /// Reads the header of the qcow2 image file at `path` and opens its metadata (for writing
    /// when `writable`), the backing files locked as `mode` says.
    fn open_file(
        path: &Path,
        writable: bool,
        mode: LockMode,
        open_backing: bool,
    ) -> Result<(Vec<u8>, Opening), OpenError> {
        let failed = |source| OpenError::Image {
            path: path.to_path_buf(),
            source,
        };
        let head = read_header(path).map_err(failed)?;
        check_qcow2_header(path, &head, writable)?;
        let gate = ChainGate::new(mode, open_backing);
        gate.visit(path).map_err(failed)?;
        let storage = EngineStorage::open_path(path, writable).map_err(failed)?;
        let opening = open_format(path, &head, storage, writable, gate)?;
        Ok((head, opening))
    }

    /// Opens the qcow2 image inside the RBD image `image` (named `path`), for writing when
    /// `writable`. It has no backing file (refused), and no lock of QEMU's bytes: the RBD
    /// image's exclusive lock, the caller's, keeps other writers out.
    #[cfg(feature = "rbd")]
    pub(crate) fn open_rbd(
        path: &Path,
        image: Arc<aio_rbd::RbdImage>,
        writable: bool,
        records: Option<aio_rbd::LockRecords>,
    ) -> Result<Self, OpenError> {
        let (head, opening) = Self::open_rbd_format(path, &image, writable)?;
        let source = source::Source::Rbd { image, records };
        Self::new(path, &head, opening, source, vec![], writable)
    }

    /// Reads the header of the qcow2 image in the RBD image `image` and opens its metadata.
    #[cfg(feature = "rbd")]
    fn open_rbd_format(
        path: &Path,
        image: &Arc<aio_rbd::RbdImage>,
        writable: bool,
    ) -> Result<(Vec<u8>, Opening), OpenError> {
        let failed = |source| OpenError::Image {
            path: path.to_path_buf(),
            source,
        };
        let mut head = vec![0u8; 4096];
        let n = image.read_at(0, &mut head)?;
        head.truncate(n);
        check_qcow2_header(path, &head, writable)?;
        if header_field(&head, 8, 8).is_some_and(|at| at != 0) {
            return Err(OpenError::FormatNotServed {
                path: path.to_path_buf(),
                reason: "a qcow2 image in RBD with a backing file is not served: \
                         `qemu-img convert` it to a whole image first",
            });
        }
        let storage = rbd_storage::RbdStorage::new(image.clone(), path).map_err(failed)?;
        let gate = ChainGate::new(LockMode::Off, true);
        let opening = open_format(path, &head, EngineStorage::Rbd(storage), writable, gate)?;
        Ok((head, opening))
    }

    /// The image served from `opening` (its header `head`), holding `locks` and the backing
    /// files' while it is served.
    fn new(
        path: &Path,
        head: &[u8],
        opening: Opening,
        source: source::Source,
        mut locks: Vec<ImageLock>,
        writable: bool,
    ) -> Result<Self, OpenError> {
        let Opening {
            opened,
            chain,
            bitmaps,
            locks: mut backing_locks,
            file,
            opens_backing,
        } = opening;
        locks.append(&mut backing_locks);
        Ok(Qcow2Image {
            cache: cache::MappingCache::new(cluster_bits(head), opened.size()),
            access: Arc::new(RwLock::new(opened)),
            path: path.to_path_buf(),
            chain,
            bitmaps_marked_inconsistent: Mutex::new(bitmaps),
            writable: AtomicBool::new(writable),
            write_back: write_back::WriteBack::default(),
            locks: Mutex::new(locks),
            source,
            cluster_bits: cluster_bits(head),
            durable: Arc::new(durable::DurableBitmaps::new(file, 1 << cluster_bits(head))),
            node_backing: node_slot::NodeBacking::new(opens_backing),
        })
    }

    /// The disk's size in bytes (the image's virtual size).
    pub(crate) fn size(&self) -> u64 {
        current::block_on(self.access.read()).size()
    }

    /// Makes the image's virtual size `bytes` (growing adds unallocated clusters; shrinking
    /// drops the clusters past the new end) and writes the header. Waits for the requests
    /// holding the image, then holds it alone.
    pub(crate) fn resize(&self, bytes: u64) -> io::Result<()> {
        current::block_on(async {
            let mut access = self.access.write().await;
            // The bitmaps kept on disk have clusters for the old size only: in use from now on,
            // until the clean close stores them at the new size.
            let released = self.durable.release_all();
            if let (false, Some(qcow2)) = (
                released.is_empty(),
                access.downcast_ref::<Qcow2<EngineStorage>>(),
            ) {
                let names: Vec<&str> = released.iter().map(String::as_str).collect();
                qcow2.mark_bitmaps_in_use(&names).await?;
            }
            let resized = access
                .resize(bytes, imago::format::PreallocateMode::None)
                .await;
            // Shrinking frees clusters past the new end.
            self.cache.clear(0, u64::MAX);
            resized?;
            access.flush().await
        })
    }

    /// The backing files, nearest first.
    pub(crate) fn backing_chain(&self) -> &[PathBuf] {
        &self.chain
    }

    /// Writes imago's cached metadata and syncs the image's files (blocking, on the calling
    /// thread; waits for requests holding the image alone).
    pub(crate) fn close(&self) -> io::Result<()> {
        current::block_on(async {
            let access = self.access.read().await;
            access.flush().await?;
            access.sync().await
        })
    }
}

impl Drop for Qcow2Image {
    fn drop(&mut self) {
        // An inactive image writes nothing: another process may own it now.
        if !self.writable.load(Ordering::Acquire) {
            return;
        }
        // Async imago does not flush on drop: what a stop leaves must pass `qemu-img check`.
        // (Shared, not alone: a direct request the engine still holds keeps a read lock.)
        if let Err(e) = current::block_on(async {
            let access = self.access.read().await;
            access.flush().await?;
            access.sync().await
        }) {
            eprintln!(
                "image {}: flushing its metadata failed: {e}",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A qcow2 header's first 32 bytes with `cluster_bits` and the virtual `size`.
    fn head(cluster_bits: u32, size: u64) -> Vec<u8> {
        let mut head = vec![0u8; 32];
        head[..4].copy_from_slice(b"QFI\xfb");
        head[20..24].copy_from_slice(&cluster_bits.to_be_bytes());
        head[24..32].copy_from_slice(&size.to_be_bytes());
        head
    }

    #[test]
    fn the_l2_cache_covers_the_disk_within_32_mib_and_never_below_imagos_default() {
        let default = imago::qcow2::DEFAULT_L2_CACHE_ENTRIES;
        // 64 KiB clusters: one table covers 512 MiB.
        assert_eq!(l2_cache_entries(&head(16, 1 << 30)), default);
        assert_eq!(l2_cache_entries(&head(16, 100 << 30)), 200);
        assert_eq!(l2_cache_entries(&head(16, 256 << 30)), 512);
        assert_eq!(
            l2_cache_entries(&head(16, 1 << 40)),
            512,
            "32 MiB of tables at most"
        );
        // 2 MiB clusters: 16 tables are 32 MiB, below imago's default, which stays.
        assert_eq!(l2_cache_entries(&head(21, 1 << 50)), default);
        // 4 KiB clusters: one table covers 2 MiB; 32 MiB is 8192 tables.
        assert_eq!(l2_cache_entries(&head(12, 1 << 30)), 512);
        assert_eq!(l2_cache_entries(&head(12, 1 << 40)), 8192);
        assert_eq!(
            l2_cache_entries(&head(16, 0)[..20]),
            default,
            "a short header"
        );
    }
}
