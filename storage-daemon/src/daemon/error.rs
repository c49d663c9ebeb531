//! The daemon's errors: why it stopped ([`DaemonError`]), why one disk could not be served
//! ([`DiskError`]), why the NBD server or an export could not be ([`NbdError`]).
//!
//! This module owns the error types and their messages; it names no other file of the daemon,
//! so every one of them may return these.

use std::io;

use aio_virtio_blk::device::DeviceError;

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// A disk's image could not be opened or served as it is.
    #[error("{spec}: {source}")]
    Disk {
        /// The disk as its user named it: `--disk <socket>`, or `export '<id>' (<socket>)` for
        /// an export given an id (qemu-storage-daemon's form, QMP).
        spec: String,
        /// Why.
        #[source]
        source: DiskError,
    },
    /// Two disks collide: one socket, or one image with a writer. It names both.
    #[error("--disk {first} and --disk {second}: {reason}")]
    Conflict {
        /// The earlier disk.
        first: String,
        /// The later one.
        second: String,
        /// How they collide.
        reason: String,
    },
    /// An iothread could not start (its backends were refused) or failed.
    #[error("{0}")]
    IoThread(#[from] aio_loop::IoThreadError),
    /// The NBD server or one of its exports could not be served.
    #[error(transparent)]
    Nbd(#[from] NbdError),
    /// The control loop's backends could not start.
    #[error("{what}: {source}")]
    Start {
        /// What could not start.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Why one disk could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiskError {
    /// The image was refused (it cannot be opened, its size, its format).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Its socket could not be created or watched.
    #[error("socket: {0}")]
    Socket(#[source] io::Error),
    /// It names an iothread the daemon does not have.
    #[error("iothread={iothread}: the daemon has {iothreads} iothreads (numbered from 0)")]
    NoSuchIoThread {
        /// The iothread named.
        iothread: u16,
        /// How many there are.
        iothreads: u16,
    },
}

/// Why the NBD server or an export could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NbdError {
    /// The server's socket could not be made.
    #[error("NBD server {addr}: {source}")]
    Listen {
        /// Where it was to listen.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An export was refused (its image, its name, its options).
    #[error("NBD export '{name}': {reason}")]
    Export {
        /// The export's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A dirty bitmap the export was to serve was refused (QEMU's text alone, as QMP gives it).
    #[error(transparent)]
    Bitmap(#[from] super::nbd_bitmaps::ExportBitmapError),
    /// The server's TLS credentials could not be used.
    #[error("NBD server TLS credentials: {0}")]
    Tls(#[from] aio_nbd::TlsError),
    /// Exports were given without a server to offer them.
    #[error("NBD exports need an NBD server (--nbd ADDR, or --nbd-server)")]
    NoServer,
}
