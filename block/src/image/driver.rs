//! What each kind of image does ([`Driver`]), and what a queue lends a kind to run its
//! requests on ([`QueueIo`]).
//!
//! This module owns the contract between the image and its kinds; it implements none of
//! them (`raw.rs`, `null.rs`, the `qcow2` module do) and runs nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;

use super::error::{ActivationError, ResizeError};
use super::options::ImageOptions;
use crate::request::{BlockRequest, Reply};
use crate::status::{Allocation, Extent};

/// Where a queue's block status answer goes.
pub(crate) type StatusDone = Box<dyn FnOnce(io::Result<Vec<Extent>>)>;

/// Where an allocation-depth query ends.
pub(crate) type DepthDone = Box<dyn FnOnce(io::Result<Vec<Allocation>>)>;

/// Why a kind has no I/O outside a request (an RBD image: librbd's requests come back to a
/// queue's context only).
fn outside_unsupported(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("a {kind} image takes no I/O outside its queues"),
    )
}

/// The engine one queue's requests run on, as each kind reaches it.
pub(crate) struct QueueIo<L: EventLoop + 'static, E: IoEngine + 'static> {
    /// The engine, attached to the queue's context.
    pub(crate) engine: AttachedEngine<L, E>,
    /// The same engine, as a qcow2 image's storage reaches it (type-erased: the image is
    /// shared by iothreads whose engines differ).
    #[cfg(feature = "qcow2")]
    pub(crate) image_engine: Rc<dyn crate::qcow2::current::ImageEngine>,
    /// An RBD image's requests from this queue, made on the first (librbd's, not the engine:
    /// their ends come back to this queue's context).
    #[cfg(feature = "rbd")]
    pub(crate) rbd: std::cell::OnceCell<aio_rbd::RbdQueue>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> QueueIo<L, E> {
    pub(crate) fn new(engine: AttachedEngine<L, E>) -> Self {
        QueueIo {
            #[cfg(feature = "qcow2")]
            image_engine: Rc::new(engine.clone()),
            #[cfg(feature = "rbd")]
            rbd: std::cell::OnceCell::new(),
            engine,
        }
    }
}

/// What one kind of image does: the contract each kind's module fulfils.
///
/// * `submit` ends every request it is given exactly once through `reply`, now or later on
///   the queue's context, and never touches a request's memory after its end;
/// * `resize` changes only what stores the sectors (the size users see is the image's);
/// * `close` leaves nothing cached (a qcow2 image's metadata written and synced);
/// * `inactivate` leaves nothing cached and no lock held, `activate` takes the locks and
///   forgets whatever was read before (both called one at a time, with nothing in flight).
pub(crate) trait Driver {
    /// What is served: `"raw"`, `"qcow2"`, `"null"`.
    fn format_name(&self) -> &'static str;

    /// The backing files, nearest first.
    fn backing_chain(&self) -> &[PathBuf] {
        &[]
    }

    /// The persistent dirty bitmaps that opening the image writable marked inconsistent.
    fn bitmaps_marked_inconsistent(&self) -> Vec<String> {
        Vec::new()
    }

    /// Its cluster size, where it has one (qcow2).
    fn cluster_size(&self) -> Option<u64> {
        None
    }

    /// Whether it keeps persistent dirty bitmaps.
    fn stores_bitmaps(&self) -> bool {
        false
    }

    /// The persistent dirty bitmaps the image holds, over `size` bytes (qcow2; read-only
    /// ones when `read_only`).
    fn load_bitmaps(
        &self,
        _size: u64,
        _read_only: bool,
    ) -> io::Result<Vec<crate::bitmap::DirtyBitmap>> {
        Ok(Vec::new())
    }

    /// Persistent bitmap `name` of the nearest backing file the image opened from its
    /// header that has one, read-only (qcow2).
    fn backing_file_bitmap(&self, _name: &str) -> io::Result<Option<crate::bitmap::DirtyBitmap>> {
        Ok(None)
    }

    /// Stores the persistent bitmaps of `set` in the image and removes those it no longer
    /// holds (qcow2).
    fn store_bitmaps(&self, _set: &crate::bitmap::BitmapSet) -> io::Result<()> {
        Ok(())
    }

    /// Keeps the persistent ones of `bitmaps` consistent in the image while it is open
    /// (qcow2, `qcow2/durable.rs`); blocking.
    fn keep_bitmaps(
        &self,
        _bitmaps: &[std::sync::Arc<crate::bitmap::DirtyBitmap>],
    ) -> io::Result<()> {
        Ok(())
    }

    /// Makes `[offset, offset + len)` durable in the bitmaps kept in the image before a
    /// change of that range runs (qcow2).
    fn bitmaps_before_write(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// Fills `buf` from `offset` on the calling thread, blocking: I/O outside a request (a
    /// block job's copy, `image/outside.rs`). `buf` is aligned as the image's file asks
    /// (an [`AlignedBuf`](aio_core::engine::AlignedBuf)).
    fn read_blocking(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<()> {
        Err(outside_unsupported(self.format_name()))
    }

    /// Writes `buf` at `offset` on the calling thread, blocking (as `read_blocking`).
    fn write_blocking(&self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(outside_unsupported(self.format_name()))
    }

    /// Makes `[offset, offset + len)` read as zeros on the calling thread, blocking.
    fn write_zeroes_blocking(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(outside_unsupported(self.format_name()))
    }

    /// Writes back what the kind caches and syncs its files on the calling thread.
    fn flush_blocking(&self) -> io::Result<()> {
        Err(outside_unsupported(self.format_name()))
    }

    /// Makes `node` (None: none) the image whose bytes its unallocated areas read (QEMU's
    /// `backing=NODE`; qcow2 opened without its backing file).
    fn set_backing_node(
        &self,
        _node: Option<std::sync::Arc<dyn super::hooks::BackingNode>>,
    ) -> Result<(), super::error::BackingNodeError> {
        Err(super::error::BackingNodeError::NoBacking(
            self.format_name(),
        ))
    }

    /// Writes what the kind caches and syncs its files.
    fn close(&self) -> io::Result<()> {
        Ok(())
    }

    /// Makes the kind inactive (the image already refuses all but reads, and nothing is in
    /// flight: the caller drained it): writes back and syncs what it caches, drops its caches
    /// and lets go of its locks; a qcow2 image first stores the persistent bitmaps of
    /// `bitmaps` (QEMU's `qcow2_inactivate`). On an error the kind is as it was (its locks
    /// held).
    fn inactivate(
        &self,
        _path: &Path,
        _bitmaps: &crate::bitmap::BitmapSet,
    ) -> Result<(), ActivationError> {
        Ok(())
    }

    /// Takes the locks `options` ask for on the image `path` and reads what it caches afresh;
    /// returns the size now (None: unchanged). On an error the kind is as it was (inactive,
    /// holding nothing).
    fn activate(
        &self,
        _path: &Path,
        _options: &ImageOptions,
    ) -> Result<Option<u64>, ActivationError> {
        Ok(None)
    }

    /// The extents of `[offset, offset + len)` of an image of `size` bytes, the part past
    /// `size` a hole (blocking: `lseek`, and a qcow2 image's metadata read where its mapping
    /// is not cached).
    fn block_status(&self, offset: u64, len: u64, size: u64) -> io::Result<Vec<Extent>>;

    /// [`block_status`](Self::block_status) for a queue's context, `done` called once with
    /// the answer: now, where finding it takes no more than a syscall (a raw file's `lseek`,
    /// as QEMU's `file-posix` does in its coroutine), or from a task of `ctx` whose metadata
    /// reads go to the queue's engine (qcow2).
    fn block_status_on<L, E>(
        &self,
        _io: &QueueIo<L, E>,
        _ctx: &AioContext<L>,
        (offset, len, size): (u64, u64, u64),
        done: StatusDone,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
    {
        done(self.block_status(offset, len, size));
    }

    /// The depths of `[offset, offset + len)` (an image of `size` bytes) on a queue's
    /// context, told to `done`: the image itself holds every byte of a one-layer kind (depth
    /// 1), nothing past its end (0).
    fn allocation_on<L, E>(
        &self,
        _io: &QueueIo<L, E>,
        _ctx: &AioContext<L>,
        (offset, len, size): (u64, u64, u64),
        done: DepthDone,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
    {
        let mut out = Vec::new();
        let end = offset.saturating_add(len);
        let inside = end.min(size).max(offset);
        crate::status::push_depth(&mut out, offset, inside - offset, 1);
        crate::status::push_depth(&mut out, inside, end - inside, 0);
        done(Ok(out));
    }

    /// Makes what stores the sectors `bytes` long (the image was `old` bytes).
    fn resize(&self, bytes: u64, old: u64) -> Result<(), ResizeError>;

    /// Runs `request` (checked against the image's size and mode) on `io`, a queue's engine.
    fn submit<L, E, R>(
        &self,
        io: &QueueIo<L, E>,
        ctx: &AioContext<L>,
        reply: &Rc<R>,
        request: BlockRequest,
        tag: R::Tag,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
        R: Reply;

    /// Readies what a batch's requests at `offsets` will look up first.
    fn prefetch(&self, _offsets: &mut dyn Iterator<Item = u64>) {}

    /// Whether requests run as tasks of the queue's context (which a batch's end runs).
    fn runs_tasks(&self) -> bool {
        false
    }
}
