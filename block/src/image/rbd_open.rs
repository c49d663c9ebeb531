//! Opening an RBD image as an [`Image`]: the format rule (a qcow2 image in RBD served as
//! qcow2), the exclusive lock for a writer, inactive opens, and the image's RBD accessors.
//!
//! This module owns the `impl Image` of RBD images; the disk's requests are `rbd.rs`'s.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use aio_rbd::{Cluster, LockRecords, LockTaken, RbdImage, RbdTarget};

use super::error::OpenError;
use super::rbd::{writes_alone, RbdDisk};
use super::{check_size, Backing, Image, ImageOptions};
use crate::format::{self, ImageFormat, KnownFormat};

/// `rbd:pool/image`: how an RBD image is named where a path is expected.
fn name_of(target: &RbdTarget) -> PathBuf {
    PathBuf::from(format!("rbd:{}", target.spec))
}

impl Image {
    /// Opens the RBD image `target` names (connecting to its cluster: blocking, up to the
    /// cluster's mount timeout), with the format rule of [`ImageFormat`] and, for a writable
    /// image, librbd's exclusive lock (see [`aio_rbd::RbdImage::lock_exclusive`]; `records`
    /// lets a restarted process break the lock its dead predecessor left).
    pub fn open_rbd(
        target: &RbdTarget,
        options: ImageOptions,
        records: Option<&LockRecords>,
    ) -> Result<Self, OpenError> {
        Self::open_rbd_as(target, options, records, false)
    }

    /// Opens the RBD image `target` names as [`open_rbd`](Self::open_rbd) does, but
    /// [inactive](Self::open_inactive): the exclusive lock is not taken (another client may
    /// own the image) and nothing is written (a qcow2 image in it is opened read-only);
    /// [`activate`](Self::activate) takes it.
    pub fn open_rbd_inactive(
        target: &RbdTarget,
        options: ImageOptions,
        records: Option<&LockRecords>,
    ) -> Result<Self, OpenError> {
        let image = Self::open_rbd_as(target, options, records, true)?;
        image
            .active
            .store(false, std::sync::atomic::Ordering::Release);
        Ok(image)
    }

    fn open_rbd_as(
        target: &RbdTarget,
        options: ImageOptions,
        records: Option<&LockRecords>,
        inactive: bool,
    ) -> Result<Self, OpenError> {
        let path = name_of(target);
        let cluster = Cluster::connect(&target.cluster)?;
        let image = RbdImage::open(&cluster, &target.spec, options.read_only)?;
        let mut options = options;
        options.read_only |= image.is_read_only();
        let probed = options.format == ImageFormat::Auto;
        if options.format != ImageFormat::Raw {
            let mut head = vec![0u8; format::PROBE_BYTES];
            let n = image.read_at(0, &mut head)?;
            match (options.format, format::probe(&head[..n])) {
                (_, Some(KnownFormat::Qcow2)) | (ImageFormat::Qcow2, _) => {
                    return Self::open_rbd_qcow2(path, image, options, records, inactive);
                }
                (_, Some(format)) => return Err(OpenError::FormatFound { path, format }),
                _ => {}
            }
        }
        let lock = match writes_alone(&options, true) && !inactive {
            true => Some(image.lock_exclusive(records)?),
            false => None,
        };
        let size = check_size(&path, image.size()?)?;
        let disk = RbdDisk {
            image,
            probed,
            lock: Mutex::new(lock),
            records: records.cloned(),
        };
        Ok(Self::new(Backing::Rbd(disk), &path, size, options))
    }

    /// The qcow2 image inside the RBD image `image`, under the RBD image's exclusive lock
    /// (`inactive`: read-only, without it, until activated).
    #[cfg(feature = "qcow2")]
    fn open_rbd_qcow2(
        path: PathBuf,
        image: Arc<RbdImage>,
        options: ImageOptions,
        records: Option<&LockRecords>,
        inactive: bool,
    ) -> Result<Self, OpenError> {
        // A qcow2 image's metadata has one writer: shared writing is never allowed.
        if writes_alone(&options, false) && !inactive {
            image.lock_exclusive(records)?;
        }
        let writable = !options.read_only && !inactive;
        let records = records.cloned();
        let qcow2 = crate::qcow2::Qcow2Image::open_rbd(&path, image, writable, records)?;
        let size = check_size(&path, qcow2.size())?;
        Ok(Self::new(
            Backing::Qcow2(Arc::new(qcow2)),
            &path,
            size,
            options,
        ))
    }

    #[cfg(not(feature = "qcow2"))]
    fn open_rbd_qcow2(
        path: PathBuf,
        _image: Arc<RbdImage>,
        _options: ImageOptions,
        _records: Option<&LockRecords>,
        _inactive: bool,
    ) -> Result<Self, OpenError> {
        Err(OpenError::FormatNotBuilt {
            path,
            format: KnownFormat::Qcow2,
        })
    }

    /// What opening an RBD image did about its exclusive lock, for the caller to tell its
    /// user: [`LockTaken::BrokeStale`] (a dead predecessor's lock broken),
    /// [`LockTaken::Unsupported`] (the image has no exclusive-lock feature: nothing stops a
    /// second writer). None for a read-only or shared image, an inactive one, and any other
    /// kind (a qcow2 image in RBD included).
    pub fn rbd_lock(&self) -> Option<LockTaken> {
        match self.backing() {
            Backing::Rbd(disk) => disk
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            _ => None,
        }
    }

    /// The RBD image behind this one (None for any other kind).
    pub fn rbd(&self) -> Option<&Arc<RbdImage>> {
        match self.backing() {
            Backing::Rbd(disk) => Some(&disk.image),
            _ => None,
        }
    }
}
