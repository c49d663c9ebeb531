//! Which parts of an image hold data (`rbd_diff_iterate2`), and the worker thread that asks
//! librbd without blocking a loop.
//!
//! This module owns block status of an RBD image; it never submits I/O (`queue.rs` does)
//! and runs nothing off the loop itself (the image's worker does).
//!
//! * **Whole objects.** librbd answers from the object map (`fast-diff`) when the image has
//!   one, an object at a time: an object any byte of which was written is data. Images
//!   without an object map are answered by listing their objects (slower, same answer).
//! * **librbd before 17 (Ceph tracker 53784).** With `whole_object`, a range that does not
//!   start on an object boundary was answered wrong; as QEMU does, the range asked of librbd
//!   starts at the boundary below, and the answer is cut to the range asked.
//! * **One worker per image.** Started on the first call, it runs the image's calls in turn
//!   and ends when the image closes.

use std::ffi::c_int;
use std::ffi::c_void;

use crate::error::{check, RbdError};
use crate::image::{call_error, RbdImage};

/// What the diff callback gathers.
struct Gathered {
    extents: Vec<(u64, u64)>,
}

/// `rbd_diff_iterate2`'s callback: one changed extent (`exists`: data, not a discard).
unsafe extern "C" fn extent(offset: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Gathered` of the `allocated` call running the iteration, which
    // outlives it and is reached by nothing else meanwhile.
    let gathered = unsafe { &mut *arg.cast::<Gathered>() };
    if exists != 0 {
        match gathered.extents.last_mut() {
            Some((o, l)) if *o + *l == offset => *l += len as u64,
            _ => gathered.extents.push((offset, len as u64)),
        }
    }
    0
}

impl RbdImage {
    /// The extents `(offset, length)` of `[offset, offset + len)` that hold data, in order,
    /// merged, within the range (blocking: a round trip to the cluster, more without an
    /// object map). A parent image's data counts as data.
    pub fn allocated(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, RbdError> {
        if !self.begin_request() {
            return Err(call_error("rbd_diff_iterate2", self.spec(), libc::EBADF));
        }
        let end = offset.saturating_add(len);
        let start = offset - offset % self.object_size();
        let mut gathered = Gathered {
            extents: Vec::new(),
        };
        // SAFETY: an open image (counted in flight); `gathered` lives across the call and is
        // the callback's only argument; no snapshot to diff from (null).
        let ret = unsafe {
            (self.lib.rbd_diff_iterate2)(
                self.handle,
                std::ptr::null(),
                start,
                end - start,
                1,
                1,
                extent,
                (&mut gathered as *mut Gathered).cast(),
            )
        };
        self.end_request();
        check(ret.into()).map_err(|errno| call_error("rbd_diff_iterate2", self.spec(), errno))?;
        Ok(gathered
            .extents
            .into_iter()
            .filter_map(|(o, l)| {
                let (from, to) = (o.max(offset), (o + l).min(end));
                (from < to).then_some((from, to - from))
            })
            .collect())
    }
}
