//! Where a qcow2 image is stored: what opening it again (on activation) needs.
//!
//! This module owns [`Source`] only; opening and reopening are the image's (`mod.rs`,
//! `reopen.rs`).

/// Where a qcow2 image is stored, to open it again.
pub(crate) enum Source {
    /// Its file (the image's path).
    File,
    /// An RBD image: its exclusive lock is the image's lock.
    #[cfg(feature = "rbd")]
    Rbd {
        /// The RBD image.
        image: std::sync::Arc<aio_rbd::RbdImage>,
        /// What lets a restarted process break its dead predecessor's lock.
        records: Option<aio_rbd::LockRecords>,
    },
}
