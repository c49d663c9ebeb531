//! How to open one image: [`ImageOptions`].
//!
//! This module owns the options an image is opened with (read-only, format, locking,
//! `share-rw`) and their defaults; it never opens anything. A leaf: the image (`mod.rs`) and
//! its drivers name it, it names neither.

use crate::format::ImageFormat;
use crate::lock::LockMode;

/// How to open one image.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageOptions {
    /// Refuse writes, discards, write-zeroes and resizes; open the file read-only.
    pub read_only: bool,
    /// The image's format: [`ImageFormat::Auto`] serves a qcow2 header as qcow2, refuses any
    /// other known format's and serves the rest as raw; [`ImageFormat::Raw`] serves any image
    /// as raw; [`ImageFormat::Qcow2`] only a qcow2 image.
    pub format: ImageFormat,
    /// QEMU's `locking=`: whether the image (and a qcow2 image's backing files) are locked
    /// as QEMU locks them ([`crate::lock`]). Default `auto`.
    pub locking: LockMode,
    /// `share-rw=on`: let other users write the image beside this one. A qcow2 image never
    /// shares write, whatever this says: its metadata is written by one user only.
    pub share_rw: bool,
    /// Whether a qcow2 image's backing file, as its header names it, is opened (the
    /// default). False: QEMU's `backing=null` or `backing=NODE`; the image reads zeros where
    /// it is unallocated until a node is attached ([`Image::set_backing_node`]).
    ///
    /// [`Image::set_backing_node`]: super::Image::set_backing_node
    pub open_backing: bool,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            read_only: false,
            format: ImageFormat::Auto,
            locking: LockMode::Auto,
            share_rw: false,
            open_backing: true,
        }
    }
}

impl ImageOptions {
    /// Options for a writable image of `format`, locked as QEMU locks one.
    pub fn new(format: ImageFormat) -> Self {
        ImageOptions {
            format,
            ..Self::default()
        }
    }

    /// The same options, read-only when `read_only`.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The same options with `locking`.
    pub fn locking(mut self, locking: LockMode) -> Self {
        self.locking = locking;
        self
    }

    /// The same options, a qcow2 image's backing file opened or not ([`open_backing`]).
    ///
    /// [`open_backing`]: Self::open_backing
    pub fn open_backing(mut self, open_backing: bool) -> Self {
        self.open_backing = open_backing;
        self
    }

    /// The same options, sharing write with other users when `share_rw`.
    pub fn share_rw(mut self, share_rw: bool) -> Self {
        self.share_rw = share_rw;
        self
    }
}
