//! Creating images, as QEMU's drivers do for `blockdev-create`: a `file` (QEMU's
//! `raw_co_create`) and a qcow2 image on a file (`qcow2_co_create`).
//!
//! This module owns the creation options, their checks in QEMU's order with QEMU's texts,
//! and the creation itself (synchronous: the caller runs it off its event loop, as a job);
//! never a node graph, a job or QMP. The qcow2 layout is imago's ([`create_qcow2`]).
//!
//! * A file is created (or opened) with mode 0644, locked as QEMU's creator locks it (write
//!   and resize held, everything but resize shared), cut to 0 and sized with the asked
//!   preallocation (`off`: a sparse `ftruncate`; `falloc`: `posix_fallocate`; `full`: zeros
//!   written); `metadata` is refused with QEMU's text.
//! * A qcow2 image is written over an existing file, which it holds with write and resize
//!   while it formats it.

#[cfg(feature = "qcow2")]
mod qcow2;

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::lock::{Access, ImageLock, LockError, LockMode, Permissions};

#[cfg(feature = "qcow2")]
pub use qcow2::create_qcow2;

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
    fn io(what: &'static str) -> impl FnOnce(io::Error) -> CreateError {
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

/// What QEMU's creators hold on the file they write: write and resize, sharing everything
/// but resize (the file has the asked size when they return).
fn creator_access(share_resize: bool) -> Access {
    let held = Permissions::WRITE | Permissions::RESIZE;
    let shared = if share_resize {
        Permissions::ALL
    } else {
        Permissions::CONSISTENT_READ | Permissions::WRITE | Permissions::WRITE_UNCHANGED
    };
    Access { held, shared }
}

/// Creates the file `opts` describes, as QEMU's `raw_co_create` does: created (or opened)
/// mode 0644, locked, emptied, then sized with its preallocation.
pub fn create_file(opts: &FileCreate) -> Result<(), CreateError> {
    let path = &opts.filename;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
        .map_err(|source| CreateError::Create {
            path: path.clone(),
            source,
        })?;
    let _lock = ImageLock::acquire(&file, path, creator_access(false), LockMode::Auto)?;
    file.set_len(0)
        .map_err(CreateError::io("Could not resize file"))?;
    let size = opts.size;
    match opts.preallocation {
        Preallocation::Off => file
            .set_len(size)
            .map_err(CreateError::io("Could not resize file"))?,
        Preallocation::Falloc => {
            if size > 0 {
                let len = libc::off_t::try_from(size)
                    .map_err(|_| CreateError::Invalid("Could not preallocate new data".into()))?;
                // SAFETY: posix_fallocate on a descriptor the `File` keeps open; no memory
                // is passed.
                let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
                if err != 0 {
                    return Err(CreateError::Io {
                        what: "Could not preallocate new data",
                        source: io::Error::from_raw_os_error(err),
                    });
                }
            }
        }
        Preallocation::Full => {
            file.set_len(size)
                .map_err(CreateError::io("Could not resize file"))?;
            write_zeros(&mut file, size)
                .map_err(CreateError::io("Could not write zeros for preallocation"))?;
        }
        Preallocation::Metadata => {
            return Err(CreateError::Invalid(
                "Unsupported preallocation mode: metadata".into(),
            ))
        }
    }
    Ok(())
}

/// Writes `len` zero bytes from the start of `file`, 64 KiB at a time (QEMU's chunk).
fn write_zeros(file: &mut File, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; 64 << 10];
    file.seek(SeekFrom::Start(0))?;
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_data()
}

/// Opens the existing file `path` for a format to be written on it, locked as QEMU's format
/// creators hold it.
fn open_for_format(path: &Path) -> Result<(File, ImageLock), CreateError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| CreateError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let lock = ImageLock::acquire(&file, path, creator_access(true), LockMode::Auto)?;
    Ok((file, lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_created_sized_and_refused_in_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.raw");
        std::fs::write(&path, b"old data").unwrap();
        for (mode, size) in [
            (Preallocation::Off, 1 << 20),
            (Preallocation::Falloc, 64 << 10),
            (Preallocation::Full, 128 << 10),
        ] {
            let opts = FileCreate {
                filename: path.clone(),
                size,
                preallocation: mode,
            };
            create_file(&opts).unwrap();
            let data = std::fs::read(&path).unwrap();
            assert_eq!(data.len() as u64, size, "{mode:?}");
            assert!(
                data.iter().all(|&b| b == 0),
                "{mode:?}: the old data is gone"
            );
        }
        let missing = FileCreate {
            filename: dir.path().join("no/such.raw"),
            size: 0,
            preallocation: Preallocation::Off,
        };
        assert_eq!(
            create_file(&missing).unwrap_err().to_string(),
            format!(
                "Could not create '{}': No such file or directory",
                missing.filename.display()
            )
        );
        let metadata = FileCreate {
            preallocation: Preallocation::Metadata,
            ..missing
        };
        let metadata = FileCreate {
            filename: path,
            ..metadata
        };
        assert_eq!(
            create_file(&metadata).unwrap_err().to_string(),
            "Unsupported preallocation mode: metadata"
        );
    }
}
