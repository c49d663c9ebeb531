//! What an image lends the images and copies that stand on it, as trait objects: a backing
//! node's reads ([`BackingNode`]) and the copies made before its writes ([`CopyHook`],
//! [`CopyHooks`]). A leaf: the image implements them (`outside.rs`, `block_copy.rs`), the
//! kinds (a qcow2 image over a node) and the filter use them, and it names none of them, so
//! no file of the image, its kinds or the copies imports one that imports it back.

use std::any::Any;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::status::Extent;

/// Which image a kind is, as [`CopyHook::target_is`] compares it: the address of the kind's
/// state (a qcow2 image's), the same from the image and from the kind.
pub(crate) type KindId = usize;

/// A block node another image's unallocated areas read (QEMU's `backing=NODE`).
#[cfg_attr(not(feature = "qcow2"), allow(dead_code))] // Read by qcow2 images over a node.
pub(crate) trait BackingNode: Send + Sync + fmt::Debug {
    /// Its size in bytes.
    fn node_size(&self) -> u64;

    /// Fills `buf` from `offset`, blocking (the node's I/O outside a request).
    fn read_node(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Its block status over `[offset, offset + len)`, blocking.
    fn node_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>>;

    /// The copy before its writes whose target is the image of kind `reader`, if any (a pull
    /// backup's, whose target reads through to this node).
    fn copy_to(&self, reader: KindId) -> Option<Arc<dyn CopyHook>>;
}

/// What a read of a copy's target through to its source holds ([`CopyHook::hold_for_read`]).
pub(crate) enum ReadHold {
    /// Nothing to hold: the range is not part of the copy (read the source as it is).
    Free,
    /// The range's chunks, still to copy, held until this is dropped: the source's writes
    /// there wait, so the source reads as it was.
    Held(#[allow(dead_code)] Box<dyn Any + Send>),
    /// A chunk of the range was copied: read the target instead.
    Copied,
}

/// A copy made before an image's writes (a backup's, `block_copy.rs`).
pub(crate) trait CopyHook: Send + Sync + fmt::Debug {
    /// Before a change of `[offset, offset + len)` of the source is submitted: its chunks
    /// still to copy copied first.
    fn before_write(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Whether its target is the image of kind `kind`.
    fn target_is(&self, kind: KindId) -> bool;

    /// The chunk size it copies in.
    #[cfg_attr(not(feature = "qcow2"), allow(dead_code))] // Read by qcow2 images over a node.
    fn chunk_size(&self) -> u64;

    /// The fleecing rule for a read of the target through to the source (see [`ReadHold`]).
    #[cfg_attr(not(feature = "qcow2"), allow(dead_code))] // Read by qcow2 images over a node.
    fn hold_for_read(self: Arc<Self>, offset: u64, len: u64) -> ReadHold;
}

/// The copies an image makes before its writes: the request filter asks them.
#[derive(Debug, Default)]
pub(crate) struct CopyHooks {
    /// Whether any copy is attached: the one load a write pays when none is.
    any: AtomicBool,
    copies: Mutex<Vec<Arc<dyn CopyHook>>>,
}

impl CopyHooks {
    fn copies(&self) -> std::sync::MutexGuard<'_, Vec<Arc<dyn CopyHook>>> {
        self.copies.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs every attached copy's side before a change of `[offset, offset + len)`.
    pub(crate) fn before_write(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        let copies = self.copies().clone();
        for copy in copies {
            copy.before_write(offset, len)?;
        }
        Ok(())
    }

    /// Attaches `copy`.
    pub(crate) fn attach(&self, copy: Arc<dyn CopyHook>) {
        let mut copies = self.copies();
        copies.push(copy);
        self.any.store(true, Ordering::Release);
    }

    /// Detaches the copies `is_it` picks.
    pub(crate) fn detach(&self, is_it: impl Fn(&Arc<dyn CopyHook>) -> bool) {
        let mut copies = self.copies();
        copies.retain(|c| !is_it(c));
        self.any.store(!copies.is_empty(), Ordering::Release);
    }

    /// The attached copy whose target is the image of kind `kind`.
    pub(crate) fn copy_to(&self, kind: KindId) -> Option<Arc<dyn CopyHook>> {
        self.copies().iter().find(|c| c.target_is(kind)).cloned()
    }
}
