//! What `blockdev-create` is asked to make (QEMU's `BlockdevCreateOptionsFile` and
//! `BlockdevCreateOptionsQcow2`, as far as served) and how a creation fails.
//!
//! This module owns the options and the error type, never a creation (`file.rs`,
//! `qcow2.rs`).

use std::io;
use std::path::PathBuf;

use crate::lock::LockError;

/// QEMU's `PreallocMode`: how much of a new image is allocated when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preallocation {
    /// Nothing (a sparse file).
    #[default]
    Off,
    /// The format's metadata only (a format's mode; a file refuses it).
    Metadata,
    /// The file's blocks reserved (`posix_fallocate`).
    Falloc,
    /// Every byte written (zeros).
    Full,
}

impl Preallocation {
    /// QEMU's names, in its order.
    pub const NAMES: [&'static str; 4] = ["off", "metadata", "falloc", "full"];

    /// The mode QEMU names `name`.
    pub fn from_name(name: &str) -> Option<Preallocation> {
        match name {
            "off" => Some(Preallocation::Off),
            "metadata" => Some(Preallocation::Metadata),
            "falloc" => Some(Preallocation::Falloc),
            "full" => Some(Preallocation::Full),
            _ => None,
        }
    }

    /// QEMU's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            Preallocation::Off => "off",
            Preallocation::Metadata => "metadata",
            Preallocation::Falloc => "falloc",
            Preallocation::Full => "full",
        }
    }
}

/// A file to create (QEMU's `BlockdevCreateOptionsFile`; `nocow` and `extent-size-hint`
/// only tune some file systems and are not taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCreate {
    /// The file's path.
    pub filename: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its preallocation.
    pub preallocation: Preallocation,
}

/// A qcow2 version (QEMU's `BlockdevQcow2Version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Qcow2Version {
    /// Version 2 (`compat=0.10`).
    V2,
    /// Version 3 (`compat=1.1`), QEMU's default.
    #[default]
    V3,
}

/// A qcow2 image to write on a file (QEMU's `BlockdevCreateOptionsQcow2`, without an
/// external data file, encryption or extended L2 entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qcow2Create {
    /// The virtual disk's size in bytes.
    pub size: u64,
    /// The version.
    pub version: Qcow2Version,
    /// The cluster size in bytes (None: 64 KiB).
    pub cluster_size: Option<u64>,
    /// Whether refcount updates may be deferred (a compatible feature of version 3).
    pub lazy_refcounts: bool,
    /// The refcount width in bits (None: 16).
    pub refcount_bits: Option<i64>,
    /// The backing file's name, written in the header as given.
    pub backing_file: Option<String>,
    /// The backing file's format, written in the header (None: none written).
    pub backing_fmt: Option<String>,
    /// The preallocation (only `off` is served for qcow2).
    pub preallocation: Preallocation,
}

/// Why an image could not be created: QEMU's text for the same failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateError {
    /// Options QEMU refuses, with its words.
    #[error("{0}")]
    Invalid(String),
    /// The file could not be created.
    #[error("Could not create '{}': {}", .path.display(), strerror(.source))]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file (under a qcow2 image) could not be opened.
    #[error("Could not open '{}': {}", .path.display(), strerror(.source))]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Another process holds the file.
    #[error("{}", .0.qemu_desc())]
    Lock(#[from] LockError),
    /// A step failed: QEMU's words for the step, then the system's.
    #[error("{what}: {}", strerror(.source))]
    Io {
        /// QEMU's words for the step (`Could not resize file`).
        what: &'static str,
        /// Why.
        source: io::Error,
    },
}

impl CreateError {
    pub(super) fn io(what: &'static str) -> impl FnOnce(io::Error) -> CreateError {
        move |source| CreateError::Io { what, source }
    }
}

/// An I/O error's text as C's `strerror` gives it (Rust's, without " (os error N)").
pub fn strerror(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}
