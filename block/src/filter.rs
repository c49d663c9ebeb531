//! The request filter: what runs around every request an [`ImageQueue`](crate::ImageQueue)
//! submits, whatever the image's kind.
//!
//! This module owns the one hook in the submit path and the reply it wraps a modifying
//! request's end in; what each filter does is its own module's. Today one filter runs:
//!
//! * **Dirty bitmaps** ([`crate::bitmap`]): a write, write-zeroes or discard dirties the
//!   image's recording bitmaps when it completes, failed or not (QEMU's
//!   `bdrv_co_write_req_finish`), before its end is told to the export: once an export has
//!   seen a write end, every bitmap shows it, so a backup that drains and then reads a bitmap
//!   misses nothing. A bitmap added while a write is in flight is dirtied by it too (the set
//!   is read at the end, not at the submit).
//!
//! * **Persistent bitmaps kept on disk** (`qcow2/durable.rs`): before a write, write-zeroes
//!   or discard is submitted, the granules it touches are made durable in the persistent
//!   bitmaps a writable qcow2 image keeps consistent in its file ([`before_submit`]): a write
//!   that reaches the disk before a crash is always in the bitmaps found after it. Free once
//!   the granules are on disk (an atomic load per bitmap word); the first write into a
//!   bitmap data cluster's granules writes that cluster and syncs, blocking, before the
//!   request is submitted.
//!
//! * **Copy-before-write** ([`crate::block_copy`]): before a write, write-zeroes or discard
//!   is submitted, the chunks it touches that a backup attached to the image has not copied
//!   yet are copied to the backup's target (old data read, written there), blocking, and a
//!   chunk the backup's job is copying is waited for. Free while no backup is attached (one
//!   atomic load).
//!
//! The filter to come takes the same hook: throttling (a request held until its group's
//! budget lets it go) acts before the submit, a module of its own, called from the same place
//! in `ImageQueue::submit`.
//!
//! The wrapper costs no allocation per request while requests are in flight: a queue keeps
//! a weak hold on the one it made for the last export's reply ([`FilterCache`]) and makes
//! another only when a different reply comes or none of the old one's requests is left.

use std::any::Any;
use std::cell::RefCell;
use std::io;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use crate::image::Image;
use crate::request::Reply;

/// The filters' side before a change of `[offset, offset + len)` is submitted: the old data
/// of its chunks copied out for the backups attached to the image ([`crate::block_copy`]),
/// then its granules made durable in the persistent bitmaps kept on disk. An error fails the
/// request unrun.
///
/// Asked of the kept bitmaps themselves (one atomic load when none is kept), not of the
/// image's set: a kept bitmap removed from the set still gets every write on disk until the
/// clean close, or a crash would bring it back missing writes.
pub(crate) fn before_submit(image: &Image, (offset, len): (u64, u64)) -> io::Result<()> {
    image.copy_hooks().before_write(offset, len)?;
    image.bitmaps_before_write(offset, len)
}

/// An export's reply, with the filters' completion side run before it.
pub(crate) struct FilterReply<R: Reply> {
    inner: Rc<R>,
    image: Arc<Image>,
}

impl<R: Reply> Reply for FilterReply<R> {
    /// The export's tag, and the request's byte range.
    type Tag = (R::Tag, (u64, u64));

    fn finish(&self, (tag, (offset, len)): Self::Tag, result: io::Result<()>) {
        self.image.dirty_bitmaps().mark(offset, len);
        self.inner.finish(tag, result);
    }

    fn bounced(&self) {
        self.inner.bounced();
    }
}

/// The [`FilterReply`] a queue made last, for the reply it wraps, held weakly: the export's
/// reply often owns the queue, so a strong hold here would be a cycle that keeps the reply,
/// the queue and the image (its file, its locks) alive for ever. The requests in flight hold
/// the wrapper; once none is, the next modifying request makes a new one.
#[derive(Default)]
pub(crate) struct FilterCache {
    last: RefCell<Option<Weak<dyn Any>>>,
}

impl FilterCache {
    /// `reply` wrapped for `image`: the cached wrapper when it is alive and wraps this very
    /// reply, else a new one (then cached).
    pub(crate) fn wrap<R: Reply>(&self, image: &Arc<Image>, reply: &Rc<R>) -> Rc<FilterReply<R>> {
        let mut last = self.last.borrow_mut();
        if let Some(cached) = last.as_ref().and_then(Weak::upgrade) {
            if let Ok(wrapper) = cached.downcast::<FilterReply<R>>() {
                if Rc::ptr_eq(&wrapper.inner, reply) {
                    return wrapper;
                }
            }
        }
        let wrapper = Rc::new(FilterReply {
            inner: reply.clone(),
            image: image.clone(),
        });
        let weak: Weak<dyn Any> = Rc::downgrade(&wrapper) as Weak<dyn Any>;
        *last = Some(weak);
        wrapper
    }
}
