//! A request on a qcow2 image that the direct path (`direct.rs`) did not take: one task on
//! the queue's context per request, the caller's buffers handed to imago as they are, the
//! result back to the [`Reply`].
//!
//! This module owns the request -> imago call mapping and its result rules, and the kind's
//! [`Driver`]; the format is imago's.

use std::io::{self, IoSlice, IoSliceMut};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use aio_core::engine::{IoEngine, LentMemory};
use aio_core::EventLoop;
use aio_loop::AioContext;
use imago::io_buffers::{IoVector, IoVectorMut};
use imago::{Mapping, StorageExt};

use super::current::{DataRanges, ImageEngine, RequestIo, WithIo};
use super::storage::EngineStorage;
use super::{Opened, Qcow2Image};
use crate::bitmap::{BitmapSet, DirtyBitmap};
use crate::image::driver::{DepthDone, Driver, QueueIo, StatusDone};
use crate::image::error::{ActivationError, BackingNodeError, ResizeError};
use crate::image::ImageOptions;
use crate::request::{BlockRequest, Reply};
use crate::status::Extent;

impl Driver for Arc<Qcow2Image> {
    fn format_name(&self) -> &'static str {
        "qcow2"
    }

    fn backing_chain(&self) -> &[PathBuf] {
        Qcow2Image::backing_chain(self)
    }

    fn bitmaps_marked_inconsistent(&self) -> Vec<String> {
        let marked = self.bitmaps_marked_inconsistent.lock();
        marked
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn cluster_size(&self) -> Option<u64> {
        Some(1 << self.cluster_bits)
    }

    fn close(&self) -> io::Result<()> {
        Qcow2Image::close(self)
    }

    fn stores_bitmaps(&self) -> bool {
        self.writable.load(std::sync::atomic::Ordering::Acquire)
    }

    fn load_bitmaps(&self, size: u64, read_only: bool) -> io::Result<Vec<DirtyBitmap>> {
        Qcow2Image::load_bitmaps(self, size, read_only)
    }

    fn backing_file_bitmap(&self, name: &str) -> io::Result<Option<DirtyBitmap>> {
        Qcow2Image::backing_file_bitmap(self, name)
    }

    fn store_bitmaps(&self, set: &BitmapSet) -> io::Result<()> {
        Qcow2Image::store_bitmaps(self, set)
    }

    fn keep_bitmaps(&self, bitmaps: &[Arc<DirtyBitmap>]) -> io::Result<()> {
        Qcow2Image::keep_bitmaps(self, bitmaps)
    }

    fn bitmaps_before_write(&self, offset: u64, len: u64) -> io::Result<()> {
        Qcow2Image::bitmaps_before_write(self, offset, len)
    }

    fn inactivate(&self, _path: &Path, bitmaps: &BitmapSet) -> Result<(), ActivationError> {
        Qcow2Image::inactivate(self, bitmaps)
    }

    fn activate(
        &self,
        _path: &Path,
        options: &ImageOptions,
    ) -> Result<Option<u64>, ActivationError> {
        Qcow2Image::activate(self, options).map(Some)
    }

    fn block_status(&self, offset: u64, len: u64, size: u64) -> io::Result<Vec<Extent>> {
        self.extents(offset, len, size)
    }

    /// A task of `ctx`, its metadata reads on the queue's engine.
    fn block_status_on<L, E>(
        &self,
        io: &QueueIo<L, E>,
        ctx: &AioContext<L>,
        (offset, len, size): (u64, u64, u64),
        done: StatusDone,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
    {
        let image = self.clone();
        metadata_task(io, ctx, done, async move {
            image.extents_async(offset, len, size).await
        });
    }

    /// A task of `ctx`, its metadata reads on the queue's engine.
    fn allocation_on<L, E>(
        &self,
        io: &QueueIo<L, E>,
        ctx: &AioContext<L>,
        (offset, len, size): (u64, u64, u64),
        done: DepthDone,
    ) where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
    {
        let image = self.clone();
        metadata_task(io, ctx, done, async move {
            image.depths_async(offset, len, size).await
        });
    }

    /// Through imago on this thread: no engine is current outside a queue's task, so the
    /// storage's I/O is blocking syscalls (`file_storage.rs`).
    fn read_blocking(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bufv = IoVectorMut::from(vec![IoSliceMut::new(buf)]);
        super::current::block_on(self.read(bufv, offset))
    }

    fn write_blocking(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let bufv = IoVector::from(vec![IoSlice::new(buf)]);
        super::current::block_on(self.write(bufv, offset))
    }

    fn write_zeroes_blocking(&self, offset: u64, len: u64) -> io::Result<()> {
        let request = BlockRequest::WriteZeroes {
            offset,
            len,
            unmap: false,
        };
        super::current::block_on(async {
            self.run_other(&request).await?;
            self.write_back.run(&*self.access.read().await).await
        })
    }

    fn flush_blocking(&self) -> io::Result<()> {
        super::current::block_on(self.run_other(&BlockRequest::Flush))
    }

    fn set_backing_node(
        &self,
        node: Option<Arc<dyn crate::image::hooks::BackingNode>>,
    ) -> Result<(), BackingNodeError> {
        if self.node_backing.opens_backing() {
            return Err(BackingNodeError::BackingFileOpened);
        }
        self.node_backing.set(node);
        Ok(())
    }

    fn resize(&self, bytes: u64, _old: u64) -> Result<(), ResizeError> {
        Qcow2Image::resize(self, bytes).map_err(ResizeError::Io)
    }

    /// The direct path if it takes the request, a task of `ctx` otherwise.
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
        R: Reply,
    {
        let Err((request, tag)) = self.try_direct(&io.engine, reply, request, tag) else {
            return;
        };
        let (image, engine, reply) = (self.clone(), io.image_engine.clone(), reply.clone());
        // Detached: the task runs to its end (the caller counts it in flight until `finish`).
        ctx.spawn_detached(async move {
            let result = image.serve(&engine, request).await;
            reply.finish(tag, result);
        });
    }

    fn prefetch(&self, offsets: &mut dyn Iterator<Item = u64>) {
        self.cache.prefetch(offsets);
    }

    fn runs_tasks(&self) -> bool {
        true
    }
}

/// The address ranges `[start, end)` of `iov`.
fn ranges(iov: &LentMemory) -> DataRanges {
    iov.as_iovecs()
        .iter()
        .map(|v| (v.iov_base as usize, v.iov_base as usize + v.iov_len))
        .collect()
}

/// The caller's memory of `iov` as imago's vector to read into, for as long as `iov` is
/// borrowed.
fn read_vector(iov: &mut LentMemory) -> IoVectorMut<'_> {
    let slices = iov.as_iovecs().iter().map(|v| {
        // SAFETY: `LentMemory::new`'s promise: the segment is valid for writes of its length
        // and nothing else in this process uses it while `iov` lives, which outlives this
        // borrow of it.
        IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast(), v.iov_len) })
    });
    IoVectorMut::from(slices.collect::<Vec<_>>())
}

/// The caller's memory of `iov` as imago's vector to write from.
fn write_vector(iov: &LentMemory) -> IoVector<'_> {
    let slices = iov.as_iovecs().iter().map(|v| {
        // SAFETY: as in `read_vector`: valid for reads, and nothing in this process writes it.
        IoSlice::new(unsafe { std::slice::from_raw_parts(v.iov_base.cast(), v.iov_len) })
    });
    IoVector::from(slices.collect::<Vec<_>>())
}

impl Qcow2Image {
    /// Runs `request`, its storage I/O on `engine`.
    async fn serve(&self, engine: &Rc<dyn ImageEngine>, request: BlockRequest) -> io::Result<()> {
        let context = |memory, data| RequestIo {
            engine: engine.clone(),
            memory,
            data,
        };
        match request {
            BlockRequest::Read {
                offset,
                mut buffers,
            } => {
                let io = context(buffers.hold().cloned(), ranges(&buffers));
                let bufv = read_vector(&mut buffers);
                WithIo::new(io, self.read(bufv, offset)).await
            }
            BlockRequest::Write {
                offset,
                buffers,
                fua,
            } => {
                let io = context(buffers.hold().cloned(), ranges(&buffers));
                let bufv = write_vector(&buffers);
                WithIo::new(io, async {
                    self.write(bufv, offset).await?;
                    if fua {
                        // Force unit access as QEMU's formats do it: a flush after the write.
                        self.run_other(&BlockRequest::Flush).await?;
                    }
                    Ok(())
                })
                .await
            }
            other => {
                let done = async {
                    self.run_other(&other).await?;
                    // Metadata changed: written back before the result (see `write`).
                    if !matches!(other, BlockRequest::Flush) {
                        self.write_back.run(&*self.access.read().await).await?;
                    }
                    Ok(())
                };
                WithIo::new(context(None, DataRanges::new()), done).await
            }
        }
    }

    /// A read. One wholly inside clusters the image owns goes straight to the file at their
    /// host offset, and they are cached for the direct path (`direct.rs`); anything else
    /// (unallocated, zero, compressed, backing data) is imago's.
    async fn read(&self, bufv: IoVectorMut<'_>, offset: u64) -> io::Result<()> {
        let access = self.access.read().await;
        if let Some((storage, at, _)) = self.in_file(&access, offset, bufv.len()).await? {
            return storage.readv(bufv, at).await;
        }
        if let Some(node) = self.node_backing.get() {
            return self
                .read_over_node(&access, Some(&node), bufv, offset)
                .await;
        }
        access.readv(bufv, offset).await
    }

    /// Where `[offset, offset + len)` lies in one file, in a row: the file, the offset there,
    /// and whether it may be written in place. Clusters that may be, not cached yet, are put
    /// into the direct path's cache, with those in a row after them to the end of their L2
    /// table (one lookup fills a preallocated table's worth; a fragmented image's gives a
    /// cluster or a few).
    async fn in_file<'a>(
        &self,
        access: &'a Opened,
        offset: u64,
        len: u64,
    ) -> io::Result<Option<(&'a EngineStorage, u64, bool)>> {
        let generation = self.cache.generation();
        let (
            Mapping::Raw {
                storage,
                offset: at,
                writable,
                ..
            },
            n,
        ) = access.get_mapping(offset, len).await?
        else {
            return Ok(None);
        };
        if n < len {
            return Ok(None);
        }
        // Looked up once per run: a request the direct path refuses (over its span, its
        // buffers misaligned, the lock busy) comes back here with its clusters cached.
        if writable && self.cache.lookup(&access.data_file, offset, 1).is_none() {
            let run = self
                .cache
                .run_from(offset)
                .min(access.size().saturating_sub(offset));
            if let Ok((
                Mapping::Raw {
                    offset: run_at,
                    writable: true,
                    ..
                },
                n,
            )) = access.get_mapping(offset, run).await
            {
                (self.cache).insert(&access.data_file, generation, storage, offset, run_at, n);
            }
        }
        Ok(Some((storage, at, writable)))
    }

    /// A write. One that allocates (a cluster not yet the image's own, or one shared with a
    /// snapshot or a backing file) completes only once imago's cached metadata has been
    /// written back to the file (not synced: that is `FLUSH`'s; one write-back for every
    /// write waiting, see [`WriteBack`]), so that a daemon killed after its client saw the
    /// write done leaves the new mapping in the file, and the restarted daemon reads back what
    /// the client wrote. A write into clusters already the image's own changes no metadata and
    /// costs nothing more.
    ///
    /// A write wholly inside clusters the image already owns goes straight to the file at
    /// their host offset (imago's `Mapping::Raw { writable: true }`: "you can directly write
    /// to `offset` on `storage`"), and the clusters go into the direct path's cache, which
    /// serves the next requests there without a task. A discard or an unmapping
    /// write-zeroes, the ops here that free a cluster, wait for the image's lock this write
    /// holds.
    async fn write(&self, bufv: IoVector<'_>, offset: u64) -> io::Result<()> {
        let access = self.access.read().await;
        if let Some((storage, at, true)) = self.in_file(&access, offset, bufv.len()).await? {
            return storage.writev(bufv, at).await;
        }
        access.writev(bufv, offset).await?;
        self.write_back.run(&access).await
    }

    /// The ops without data: flush, discard, write-zeroes.
    async fn run_other(&self, request: &BlockRequest) -> io::Result<()> {
        match request {
            BlockRequest::Flush => {
                let access = self.access.read().await;
                access.flush().await?;
                access.sync().await
            }
            BlockRequest::Discard { offset, len } => {
                let mut access = self.access.write().await;
                let result = access.discard_to_any(*offset, *len).await;
                // Freed clusters leave the direct path before the lock (and so before any
                // request that could be handed them again) is released.
                self.cache.clear(*offset, *len);
                match result {
                    // Discard is advisory: a format or file without it is not an error.
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
                    other => other,
                }
            }
            BlockRequest::WriteZeroes {
                offset,
                len,
                unmap: true,
            } => {
                let mut access = self.access.write().await;
                let result = access.discard_to_zero(*offset, *len).await;
                self.cache.clear(*offset, *len);
                result
            }
            BlockRequest::WriteZeroes { offset, len, .. } => {
                // May turn clusters into zero clusters: cleared before the client hears of it.
                let result = self.access.read().await.write_zeroes(*offset, *len).await;
                self.cache.clear(*offset, *len);
                result
            }
            // Reads and writes are `serve`'s.
            BlockRequest::Read { .. } | BlockRequest::Write { .. } => {
                Err(io::ErrorKind::Unsupported.into())
            }
        }
    }
}

/// Runs `work` (metadata reads of an image, no guest memory) as a task of `ctx` whose I/O
/// goes to the queue's engine, and tells `done` its result.
fn metadata_task<L, E, T>(
    io: &QueueIo<L, E>,
    ctx: &AioContext<L>,
    done: Box<dyn FnOnce(io::Result<T>)>,
    work: impl std::future::Future<Output = io::Result<T>> + 'static,
) where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
    T: 'static,
{
    let engine = io.image_engine.clone();
    ctx.spawn_detached(async move {
        let context = RequestIo {
            engine,
            memory: None,
            data: DataRanges::new(),
        };
        done(WithIo::new(context, work).await);
    });
}
