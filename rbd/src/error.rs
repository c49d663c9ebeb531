//! What can go wrong reaching a cluster or an image, as one typed error.
//!
//! This module owns [`RbdError`] and its conversion to `io::Error`; it never decides what to
//! do about one (a daemon exits 2, a QMP command answers it, a test asserts it).

use std::ffi::CString;
use std::io;

/// An error reaching a Ceph cluster, a pool or an image, or of a call on an image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RbdError {
    /// librbd or librados is not installed (or lacks a function this crate calls).
    #[error("{library} could not be loaded ({reason}): install Ceph's client library (Debian: apt-get install {package})")]
    LibraryMissing {
        /// The library or function that was missing.
        library: String,
        /// What the dynamic loader said.
        reason: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// The cluster configuration could not be read or an option was refused.
    #[error("Ceph configuration: {what}: {}", errno_text(*.errno))]
    Config {
        /// The file or option.
        what: String,
        /// The errno librados returned.
        errno: i32,
    },
    /// No monitor answered within the mount timeout.
    #[error("Ceph cluster unreachable: no answer from the monitors {monitors} within {timeout_secs} s ({})", errno_text(*.errno))]
    Unreachable {
        /// The monitors tried (`mon_host`).
        monitors: String,
        /// `client_mount_timeout`, in seconds.
        timeout_secs: u64,
        /// The errno librados returned.
        errno: i32,
    },
    /// The monitors refused the user's key.
    #[error("Ceph refused the key of {user} (monitors {monitors}): {}", errno_text(*.errno))]
    Auth {
        /// The client name (`client.admin`).
        user: String,
        /// The monitors asked.
        monitors: String,
        /// The errno librados returned.
        errno: i32,
    },
    /// The pool does not exist.
    #[error("no Ceph pool {pool:?}")]
    NoSuchPool {
        /// The pool.
        pool: String,
    },
    /// The image (or its snapshot) does not exist.
    #[error("no RBD image {image}")]
    NoSuchImage {
        /// `pool[/namespace]/image[@snapshot]`.
        image: String,
    },
    /// The user may not do this.
    #[error("permission denied by Ceph for {what}")]
    PermissionDenied {
        /// What was asked (`open rbd/disk0`).
        what: String,
    },
    /// Another client holds the image's exclusive lock.
    #[error("RBD image {image} is locked by {holder}, another writer: stop it first")]
    Locked {
        /// `pool[/namespace]/image`.
        image: String,
        /// The lock's holder as Ceph names it: its client's address (`10.0.0.7:0/2551908805`).
        holder: String,
    },
    /// An image spec that cannot be parsed.
    #[error("bad RBD image spec {spec:?}: {reason}")]
    BadSpec {
        /// The text given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A librbd or librados call failed.
    #[error("{call} on {target}: {}", errno_text(*.errno))]
    Call {
        /// The C function.
        call: &'static str,
        /// What it was called on.
        target: String,
        /// The errno it returned.
        errno: i32,
    },
}

/// The text of an errno.
fn errno_text(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}

impl RbdError {
    /// The errno this error stands for, where it has one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RbdError::Config { errno, .. }
            | RbdError::Unreachable { errno, .. }
            | RbdError::Auth { errno, .. }
            | RbdError::Call { errno, .. } => Some(*errno),
            RbdError::NoSuchPool { .. } | RbdError::NoSuchImage { .. } => Some(libc::ENOENT),
            RbdError::PermissionDenied { .. } => Some(libc::EACCES),
            RbdError::Locked { .. } => Some(libc::EBUSY),
            RbdError::LibraryMissing { .. } | RbdError::BadSpec { .. } => None,
        }
    }
}

impl From<RbdError> for io::Error {
    fn from(e: RbdError) -> Self {
        let kind = match &e {
            RbdError::LibraryMissing { .. } => io::ErrorKind::Unsupported,
            RbdError::BadSpec { .. } | RbdError::Config { .. } => io::ErrorKind::InvalidInput,
            RbdError::NoSuchPool { .. } | RbdError::NoSuchImage { .. } => io::ErrorKind::NotFound,
            RbdError::PermissionDenied { .. } | RbdError::Auth { .. } => {
                io::ErrorKind::PermissionDenied
            }
            RbdError::Unreachable { .. } => io::ErrorKind::TimedOut,
            RbdError::Locked { .. } => io::ErrorKind::ResourceBusy,
            RbdError::Call { errno, .. } => io::Error::from_raw_os_error(*errno).kind(),
        };
        io::Error::new(kind, e)
    }
}

/// A negative return of a C call as `Err(errno)`, anything else as `Ok(value)`.
pub(crate) fn check(ret: i64) -> Result<u64, i32> {
    match ret {
        r if r < 0 => Err(i32::try_from(-r).unwrap_or(libc::EIO)),
        r => Ok(r as u64),
    }
}

/// A C string of `s`, or the error naming what it is.
pub(crate) fn c_string(s: &str, what: &str) -> Result<CString, RbdError> {
    CString::new(s).map_err(|_| RbdError::BadSpec {
        spec: s.to_string(),
        reason: format!("a NUL byte in the {what}"),
    })
}
