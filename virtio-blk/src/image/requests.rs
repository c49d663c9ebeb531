//! A virtio-blk request on a qcow2 image that the direct path (`direct.rs`) did not take: one
//! task on the queue's context per request, the guest's buffers handed to imago as they are,
//! the status back to the ring.
//!
//! This module owns the op -> imago call mapping and its status rules; the ring side is the
//! queue's ([`Completer`]), the format imago's.

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use aio_core::{AioContext, EventLoop};
use imago::io_buffers::{IoVector, IoVectorMut};
use imago::{FormatAccess, Mapping, StorageExt};
use smallvec::SmallVec;
use vm_memory::{GuestMemoryBackend, VolatileSlice};

use super::current::{GuestRanges, ImageEngine, RequestIo, WithIo};
use super::storage::EngineStorage;
use super::Qcow2Image;
use crate::chain::{BlkOp, BlkRequest, Segment};
use crate::queue::GuestMemory;
use crate::request::Completer;
use crate::spec;

/// Runs `request` (a read, write, flush, discard or write-zeroes) on `image` as a task of
/// `ctx`, its storage I/O on `engine`, and tells `ring` its status.
pub(crate) fn execute<L: EventLoop + 'static, C: Completer>(
    ctx: &AioContext<L>,
    image: &Arc<Qcow2Image>,
    engine: &Rc<dyn ImageEngine>,
    ring: &Rc<C>,
    mem: &GuestMemory,
    request: BlkRequest,
) {
    let (image, engine, ring, mem) = (image.clone(), engine.clone(), ring.clone(), mem.clone());
    // Detached: the task runs to its end (the queue counts it in flight until `finish`).
    ctx.spawn_detached(async move {
        let status = match image.serve(&engine, &mem, &request.op).await {
            Ok(()) => spec::S_OK,
            Err(_) => spec::S_IOERR,
        };
        ring.finish(&mem, &request, status);
    });
}

/// A request's guest memory as vm-memory's volatile slices, inline up to four.
type Slices<'m> = SmallVec<[VolatileSlice<'m, ()>; 4]>;

/// The guest memory of `segments`, as vm-memory's volatile slices (a segment may span
/// regions); None if one is not mapped.
fn slices<'m>(mem: &'m GuestMemory, segments: &[Segment]) -> Option<Slices<'m>> {
    let mut out = Slices::new();
    for s in segments {
        for slice in mem.get_slices(s.addr, s.len as usize) {
            let slice = slice.ok()?;
            if !slice.is_empty() {
                out.push(slice);
            }
        }
    }
    Some(out)
}

/// The host address ranges `[start, end)` of `slices`.
fn ranges(slices: &[VolatileSlice<'_, ()>]) -> GuestRanges {
    slices
        .iter()
        .map(|s| {
            let start = s.ptr_guard().as_ptr() as usize;
            (start, start + s.len())
        })
        .collect()
}

/// Writes imago's cached metadata back to the file for every request that asked before the
/// write-back began, one write-back at a time (a group commit): the allocating writes of a
/// batch wait for one write-back, not one each.
#[derive(Default)]
pub(crate) struct WriteBack {
    /// Write-backs asked for so far: each asker's ticket.
    asked: AtomicU64,
    /// Every ticket up to this one is covered by a write-back that has finished.
    done: AtomicU64,
    /// One write-back at a time; the askers queue here, and most find themselves covered.
    running: tokio::sync::Mutex<()>,
}

impl WriteBack {
    /// Returns once a write-back that began after this call has finished (or fails with it).
    async fn run(&self, access: &FormatAccess<EngineStorage>) -> io::Result<()> {
        // The caller's metadata change is in imago's cache before its ticket is taken, and a
        // write-back covers every ticket taken before it starts.
        let ticket = self.asked.fetch_add(1, Ordering::AcqRel) + 1;
        let _one = self.running.lock().await;
        if self.done.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let covers = self.asked.load(Ordering::Acquire);
        access.flush().await?;
        self.done.fetch_max(covers, Ordering::AcqRel);
        Ok(())
    }
}

fn unmapped() -> io::Error {
    io::Error::other("a request's buffer is not in guest memory")
}

impl Qcow2Image {
    /// Runs one op of a request parsed against `mem`, its storage I/O on `engine`.
    async fn serve(
        &self,
        engine: &Rc<dyn ImageEngine>,
        mem: &GuestMemory,
        op: &BlkOp,
    ) -> io::Result<()> {
        let context = |guest| RequestIo {
            engine: engine.clone(),
            memory: mem.clone(),
            guest,
        };
        match op {
            BlkOp::Read { offset, segments } => {
                let slices = slices(mem, segments).ok_or_else(unmapped)?;
                let io = context(ranges(&slices));
                // The guard keeps the mappings' pointers valid while imago uses the vector.
                let (bufv, _guard) = IoVectorMut::from_volatile_slice(slices.iter());
                WithIo::new(io, self.read(bufv, *offset)).await
            }
            BlkOp::Write { offset, segments } => {
                let slices = slices(mem, segments).ok_or_else(unmapped)?;
                let io = context(ranges(&slices));
                let (bufv, _guard) = IoVector::from_volatile_slice(slices.iter());
                WithIo::new(io, self.write(bufv, *offset)).await
            }
            other => {
                let done = async {
                    self.run_other(other).await?;
                    // Metadata changed: written back before the status (see `write`).
                    if !matches!(other, BlkOp::Flush) {
                        self.write_back.run(&*self.access.read().await).await?;
                    }
                    Ok(())
                };
                WithIo::new(context(GuestRanges::new()), done).await
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
        access.readv(bufv, offset).await
    }

    /// Where `[offset, offset + len)` lies in one file, in a row: the file, the offset there,
    /// and whether it may be written in place. Clusters that may be, not cached yet, are put
    /// into the direct path's cache, with those in a row after them to the end of their L2
    /// table (one lookup fills a preallocated table's worth; a fragmented image's gives a
    /// cluster or a few).
    async fn in_file<'a>(
        &self,
        access: &'a FormatAccess<EngineStorage>,
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
        if writable && self.cache.lookup(offset, 1).is_none() {
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
                self.cache.insert(generation, storage, offset, run_at, n);
            }
        }
        Ok(Some((storage, at, writable)))
    }

    /// A write. One that allocates (a cluster not yet the image's own, or one shared with a
    /// snapshot or a backing file) completes only once imago's cached metadata has been
    /// written back to the file (not synced: that is `FLUSH`'s; one write-back for every
    /// write waiting, see [`WriteBack`]), so that a daemon killed after the guest saw the
    /// write done leaves the new mapping in the file, and the restarted daemon reads back what
    /// the guest wrote. A write into clusters already the image's own changes no metadata and
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
    async fn run_other(&self, op: &BlkOp) -> io::Result<()> {
        match op {
            BlkOp::Flush => {
                let access = self.access.read().await;
                access.flush().await?;
                access.sync().await
            }
            BlkOp::Discard { offset, len } => {
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
            BlkOp::WriteZeroes {
                offset,
                len,
                unmap: true,
            } => {
                let mut access = self.access.write().await;
                let result = access.discard_to_zero(*offset, *len).await;
                self.cache.clear(*offset, *len);
                result
            }
            BlkOp::WriteZeroes { offset, len, .. } => {
                // May turn clusters into zero clusters: cleared before the guest hears of it.
                let result = self.access.read().await.write_zeroes(*offset, *len).await;
                self.cache.clear(*offset, *len);
                result
            }
            // Reads and writes are `serve`'s; GET_ID is answered by the queue.
            BlkOp::Read { .. } | BlkOp::Write { .. } | BlkOp::GetId { .. } => {
                Err(io::ErrorKind::Unsupported.into())
            }
        }
    }
}
