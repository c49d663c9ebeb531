//! An image served from one context: the requests one export's queue (a virtqueue, an NBD
//! connection) sends it, on the engine attached to that context.
//!
//! This module owns the checks every request passes before its kind runs it (the image's
//! end, read-only, inactive) and the batch a queue opens and closes; what a request does is
//! its kind's (`image/raw.rs`, `image/null.rs`, the `qcow2` module), and the inactive state
//! is `image/handoff.rs`'s.
//!
//! * **One batch per kick.** [`plug`](ImageQueue::plug) holds the engine's submissions,
//!   [`unplug`](ImageQueue::unplug) sends them in one kernel call; a qcow2 image's requests
//!   run as tasks, which take their first steps inside the batch, so their I/O goes with it.
//! * **A refusal is an answer.** A request past the end or not a whole one (`EINVAL`), a
//!   change to a read-only image (`EPERM`), and anything but a read of an
//!   [inactive](Image::inactivate) image (`EPERM`, as QEMU's NBD server answers "export is
//!   inactive": write, write-zeroes, discard, flush) ends at once through the [`Reply`], with
//!   the image untouched. An inactive image's reads are served.
//! * **Filtered once.** A request that passes the checks goes through the request filter
//!   ([`crate::filter`]: dirty bitmaps today, and the persistent bitmaps a qcow2 image keeps
//!   on disk made durable first) on its way to its kind.

use std::rc::Rc;
use std::sync::Arc;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;

use crate::filter::FilterCache;
use crate::image::driver::{Driver, QueueIo};
use crate::image::{dispatch, Image};
use crate::request::{self, BlockRequest, Reply};
use crate::status::{Allocation, Extent};

/// Requests to one image from one context, on one engine attached there. `!Send`: it lives
/// on its context's thread; every thread serving the image has its own.
pub struct ImageQueue<L: EventLoop + 'static, E: IoEngine + 'static> {
    image: Arc<Image>,
    io: QueueIo<L, E>,
    /// The request filter's wrapper of the last reply (`filter.rs`).
    filters: FilterCache,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> std::fmt::Debug for ImageQueue<L, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageQueue")
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> ImageQueue<L, E> {
    /// A queue of requests to `image` on `engine`.
    pub fn new(image: Arc<Image>, engine: AttachedEngine<L, E>) -> Self {
        ImageQueue {
            image,
            io: QueueIo::new(engine),
            filters: FilterCache::default(),
        }
    }

    /// The image.
    pub fn image(&self) -> &Arc<Image> {
        &self.image
    }

    /// The engine the requests run on.
    pub fn engine(&self) -> &AttachedEngine<L, E> {
        &self.io.engine
    }

    /// Holds the engine's submissions until [`unplug`](Self::unplug): one batch.
    pub fn plug(&self) {
        self.io.engine.plug();
    }

    /// Sends the batch held since [`plug`](Self::plug). A qcow2 image's requests run as
    /// tasks of `ctx`: they take their first steps now, inside the batch.
    pub fn unplug(&self, ctx: &AioContext<L>) {
        if dispatch!(self.image.backing(), d => d.runs_tasks()) {
            ctx.run_woken_tasks();
        }
        self.io.engine.unplug();
    }

    /// Readies what a batch's requests at `offsets` will look up first (a qcow2 image's
    /// direct path reads its mapping cache's slots ahead).
    pub fn prefetch(&self, offsets: impl Iterator<Item = u64>) {
        let mut offsets = offsets;
        dispatch!(self.image.backing(), d => d.prefetch(&mut offsets))
    }

    /// Runs `request` and tells `reply` its end, with `tag`: now (a refusal, the null image)
    /// or from the engine's completion, on this context.
    pub fn submit<R: Reply>(
        &self,
        ctx: &AioContext<L>,
        reply: &Rc<R>,
        request: BlockRequest,
        tag: R::Tag,
    ) {
        if let Err(e) = self.check(&request) {
            drop(request);
            return reply.finish(tag, Err(e));
        }
        // The request filter (`filter.rs`): a change to the image ends through the filters.
        if let (true, Some(range)) = (request.modifies(), request.range()) {
            if let Err(e) = crate::filter::before_submit(&self.image, range) {
                drop(request);
                return reply.finish(tag, Err(e));
            }
            let filtered = self.filters.wrap(&self.image, reply);
            let tag = (tag, range);
            return dispatch!(self.image.backing(), d => d.submit(&self.io, ctx, &filtered, request, tag));
        }
        dispatch!(self.image.backing(), d => d.submit(&self.io, ctx, reply, request, tag))
    }

    /// Block status ([`Image::block_status`]) answered on this context without blocking it:
    /// `done` is called once with the extents of `[offset, offset + len)`, now (a raw file's
    /// `lseek`, the null image) or from a task of `ctx` whose metadata reads go to this
    /// queue's engine (a qcow2 image, which may wait for a discard holding the image). Past
    /// the image's end is a hole, as there.
    pub fn block_status(
        &self,
        ctx: &AioContext<L>,
        offset: u64,
        len: u64,
        done: impl FnOnce(std::io::Result<Vec<Extent>>) + 'static,
    ) {
        let args = (offset, len, self.image.size());
        dispatch!(self.image.backing(), d => d.block_status_on(&self.io, ctx, args, Box::new(done)))
    }

    /// The allocation depths of `[offset, offset + len)` (QEMU's `qemu:allocation-depth`:
    /// 1 the image itself, 2 its first backing file, ..., 0 no layer), answered on this
    /// context as [`block_status`](Self::block_status) is: now for a one-layer image, from a
    /// task whose metadata reads go to this queue's engine for a qcow2 image.
    pub fn allocation_depth(
        &self,
        ctx: &AioContext<L>,
        offset: u64,
        len: u64,
        done: impl FnOnce(std::io::Result<Vec<Allocation>>) + 'static,
    ) {
        let args = (offset, len, self.image.size());
        dispatch!(self.image.backing(), d => d.allocation_on(&self.io, ctx, args, Box::new(done)))
    }

    /// The checks every request passes before its kind sees it.
    fn check(&self, request: &BlockRequest) -> std::io::Result<()> {
        if let Some((offset, len)) = request.range() {
            let fits = offset
                .checked_add(len)
                .is_some_and(|end| end <= self.image.size());
            if !fits || len == 0 {
                return Err(request::invalid());
            }
        }
        // Over a backing node, a write of part of an unallocated cluster would be filled from
        // no backing (`qcow2/node_backing.rs`): refused as a read-only image's.
        if request.modifies() && (self.image.is_read_only() || self.image.has_backing_node()) {
            return Err(request::read_only());
        }
        // One load, and none for a read (an inactive image serves reads).
        if !matches!(request, BlockRequest::Read { .. }) && !self.image.is_active() {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(())
    }
}

impl Image {
    /// A queue of requests to this image from the context `engine` is attached to.
    pub fn queue<L: EventLoop + 'static, E: IoEngine + 'static>(
        self: &Arc<Self>,
        engine: AttachedEngine<L, E>,
    ) -> ImageQueue<L, E> {
        ImageQueue::new(self.clone(), engine)
    }
}
