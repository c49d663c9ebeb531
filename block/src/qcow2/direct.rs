//! The direct path of a qcow2 image: a read or write wholly inside clusters the image owns in
//! place goes to the engine as a raw image's would, with no task and no call into imago.
//!
//! This module owns the direct submission; the cache it looks clusters up in is `cache.rs`'s
//! [`MappingCache`](super::cache::MappingCache). It never reads metadata: every entry
//! comes from a mapping imago returned to a request on the task path (`requests.rs`), and the
//! ops that change mappings clear it.
//!
//! * **What is cached.** The run of clusters in a row from a looked-up one to the end of its
//!   L2 table (one lookup fills a preallocated table's worth), only
//!   `Mapping::Raw { writable: true }` in the image's own data file:
//!   a cluster with one reference, neither compressed, nor shared with a snapshot, nor in a
//!   backing file. Writing it in place changes no metadata (imago's documented promise), so a
//!   direct write needs no write-back. A read-only image gets no such mappings and always
//!   takes the task path.
//! * **What clears it.** A discard and a write-zeroes (which may free a cluster or turn it
//!   into a zero cluster) and a resize clear the clusters they touch and bump a generation
//!   after imago has changed the mapping and before the client hears of it; an entry looked up
//!   before the bump is not inserted after it, so none outlives the change.
//! * **Nothing freed under a direct request.** A direct request holds the image's read lock
//!   (taken without waiting, or the request takes the task path) until its completion, as a
//!   task-path request does: a discard, which takes the lock alone, waits for it, so a freed
//!   cluster is never handed to another guest offset while a direct request still uses it.
//!   The same lock is what QEMU's qcow2 driver relies on: mappings are looked up under it,
//!   data moves outside the metadata code.

use std::rc::Rc;
use std::sync::Arc;

use aio_core::engine::{IoBuffers, IoEngine, Request};
use aio_core::EventLoop;
use aio_loop::AttachedEngine;

use super::Qcow2Image;
use crate::request::{BlockRequest, Reply};

impl Qcow2Image {
    /// Serves `request` on the direct path if it is a read or write wholly inside cached
    /// clusters and the image's read lock is free; gives it back with its tag otherwise (the
    /// task path takes it).
    #[allow(clippy::type_complexity)]
    pub(crate) fn try_direct<L, E, R>(
        &self,
        engine: &AttachedEngine<L, E>,
        reply: &Rc<R>,
        request: BlockRequest,
        tag: R::Tag,
    ) -> Result<(), (BlockRequest, R::Tag)>
    where
        L: EventLoop + 'static,
        E: IoEngine + 'static,
        R: Reply,
    {
        let (offset, buffers, write, fua) = match request {
            BlockRequest::Read { offset, buffers } => (offset, buffers, false, false),
            BlockRequest::Write {
                offset,
                buffers,
                fua,
            } => (offset, buffers, true, fua),
            other => return Err((other, tag)),
        };
        let back = move |buffers| match write {
            true => BlockRequest::Write {
                offset,
                buffers,
                fua,
            },
            false => BlockRequest::Read { offset, buffers },
        };
        // Taken before the lookup: a discard (which takes the lock alone) cannot free a cached
        // cluster between the lookup and the request's completion. A FUA write takes the
        // task path, which flushes after it.
        let Ok(held) = Arc::clone(&self.access).try_read_owned() else {
            return Err((back(buffers), tag));
        };
        let found = (self.cache)
            .lookup(&held.data_file, offset, buffers.len() as u64)
            .filter(|_| !fua);
        let Some(((file, writes), host)) = found else {
            return Err((back(buffers), tag));
        };
        // A write counts among the file's writes in flight, which imago settles before it
        // frees a cluster (as the task path's writes do).
        let in_flight = write.then(|| writes.begin());
        let io = if write {
            Request::write_guest(file, host, buffers, 0)
        } else {
            Request::read_guest(file, host, buffers, 0)
        };
        // The image's lock and the write's count are held until the kernel is done (the
        // memory's hold travels with the memory).
        let state = (reply.clone(), tag, held, in_flight);
        let submitted = engine.try_submit_with(io, state, |_, _, done, state| {
            let (reply, tag, held, in_flight) = state;
            let result = done.result.map(drop);
            drop((done.buf, held, in_flight));
            reply.finish(tag, result);
        });
        // Refused (misaligned buffers, a full engine): the task path copes.
        let Err((refused, (reply, tag, _, _))) = submitted else {
            return Ok(());
        };
        match refused.request.op.into_buffers() {
            IoBuffers::Guest(buffers) => Err((back(buffers), tag)),
            // Not the memory it was given (no engine does this): the request ends here.
            _ => {
                reply.finish(tag, Err(refused.error.into()));
                Ok(())
            }
        }
    }
}
