//! Requests to an image from one context: submitted to librbd, their ends delivered back on
//! that context's loop.
//!
//! This module owns the path of one request: its completion (`rbd_aio_create_completion`),
//! the memory librbd reads or writes, and the way back from librbd's thread to the loop that
//! submitted it. It never blocks the loop: block status runs on the image's worker thread
//! (`diff.rs`).
//!
//! * **Back on the submitting loop.** librbd calls a completion back on one of its own
//!   threads. The callback only stores the result in the queue's mailbox and schedules the
//!   queue's bottom half (QEMU's `rbd_finish_aiocb` schedules one into the request's
//!   `AioContext`); the bottom half runs the callers' completions on the loop, in one batch
//!   however many arrived. Several contexts serving one image each have their own queue, so a
//!   completion always returns to the context that submitted it (an image's single
//!   notification eventfd, `rbd_set_image_notification`, could not tell them apart).
//! * **Memory librbd may write stays alive.** A read's or write's [`Memory`] travels with the
//!   request into librbd and comes back only from the callback, after librbd is done with
//!   it; a queue dropped with requests in flight leaves their memory to the callbacks, which
//!   free it then. The image's close waits for every callback.
//! * **Each request ends once,** on the loop, never inside the submitting call (a refused
//!   submission ends through the bottom half too).

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::io;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use aio_core::engine::GuestIovecs;
use aio_core::{AioContext, BottomHalf, EventLoop};

use crate::error::{check, RbdError};
use crate::image::RbdImage;
use crate::sys;

/// The memory of a read or write: the segments librbd reads or fills, and what keeps them
/// valid (a guest-memory mapping's hold, an owned buffer), given back when the request ends.
pub struct Memory {
    iov: GuestIovecs,
    owner: Box<dyn Any + Send>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("len", &self.iov.len())
            .finish_non_exhaustive()
    }
}

impl Memory {
    /// Segments the caller vouched for (in [`GuestIovecs::new`]), kept valid by `owner` for
    /// as long as this value lives.
    pub fn new(iov: GuestIovecs, owner: Box<dyn Any + Send>) -> Self {
        Memory { iov, owner }
    }

    /// An owned buffer as a request's memory; [`into_vec`](Self::into_vec) gives it back.
    pub fn from_vec(mut buf: Vec<u8>) -> Self {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: the vector's heap memory does not move when the `Vec` value moves into
        // the box, lives as long as the box, and is reached by nothing else meanwhile.
        let iov = unsafe { GuestIovecs::new([(ptr, len)]) };
        Memory {
            iov,
            owner: Box::new(buf),
        }
    }

    /// The buffer of a [`from_vec`](Self::from_vec) memory (None for any other).
    pub fn into_vec(self) -> Option<Vec<u8>> {
        drop(self.iov);
        self.owner.downcast::<Vec<u8>>().ok().map(|b| *b)
    }

    /// The segments and their owner, apart.
    pub fn into_parts(self) -> (GuestIovecs, Box<dyn Any + Send>) {
        (self.iov, self.owner)
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.iov.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.iov.len() == 0
    }
}

/// What came back with a finished request.
pub(crate) enum Payload {
    None,
    Memory(Memory),
    Extents(Result<Vec<(u64, u64)>, RbdError>),
}

/// A request that has ended, on its way from librbd's thread to the loop.
pub(crate) struct Finished {
    token: u64,
    ret: i64,
    payload: Payload,
}

/// Where librbd's threads leave finished requests for one queue's loop.
pub(crate) struct Mailbox {
    finished: Mutex<Vec<Finished>>,
    bh: BottomHalf,
}

impl Mailbox {
    /// Leaves `finished` for the loop and wakes it (from any thread).
    pub(crate) fn post(&self, token: u64, ret: i64, payload: Payload) {
        self.finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Finished {
                token,
                ret,
                payload,
            });
        self.bh.schedule();
    }
}

/// What librbd holds while a request runs: freed by the callback.
struct InFlight {
    mailbox: Arc<Mailbox>,
    /// The image, kept open until this request's callback has ended ([`RbdImage::close`]
    /// waits for the count this request holds).
    image: *const RbdImage,
    token: u64,
    memory: Option<Memory>,
}

/// librbd's completion callback, on one of librbd's threads.
unsafe extern "C" fn request_done(c: sys::RbdCompletion, arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<InFlight>` leaked by `submit` for this completion, which
    // librbd calls back exactly once.
    let flight = unsafe { Box::from_raw(arg.cast::<InFlight>()) };
    let InFlight {
        mailbox,
        image,
        token,
        memory,
    } = *flight;
    // SAFETY: the image stays open until this request's count is ended below (its close
    // waits for it, and its drop closes it), so the pointer is valid until then.
    let image = unsafe { &*image };
    // SAFETY: `c` is this request's completion, complete now, released just below.
    let ret = unsafe { (image.lib.rbd_aio_get_return_value)(c) };
    // SAFETY: `c` is released once, here; nothing uses it after.
    unsafe { (image.lib.rbd_aio_release)(c) };
    // librbd is done with the memory: it goes back with the result.
    mailbox.post(
        token,
        ret as i64,
        memory.map_or(Payload::None, Payload::Memory),
    );
    // The last use of the image: after this its close may proceed.
    image.end_request();
}

/// What the loop does with a finished request.
enum Waiter {
    /// Tell the caller.
    Done(Box<dyn FnOnce(Result<u64, i32>, Payload)>),
    /// A write with FUA: flush first, then tell the caller.
    FlushThen(Box<dyn FnOnce(Result<u64, i32>, Payload)>),
}

/// The requests of one queue waiting for their ends.
#[derive(Default)]
struct Waiting {
    next: u64,
    by_token: HashMap<u64, Waiter>,
}

/// Requests to one image from one context, ended on that context's loop. `!Send`: it lives
/// on its context's thread; each context serving the image makes its own.
pub struct RbdQueue {
    image: Arc<RbdImage>,
    mailbox: Arc<Mailbox>,
    waiting: Rc<RefCell<Waiting>>,
}

impl std::fmt::Debug for RbdQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdQueue")
            .field("image", &self.image)
            .field("waiting", &self.waiting.borrow().by_token.len())
            .finish()
    }
}

/// A librbd result as what the caller hears.
fn as_io(result: Result<u64, i32>) -> io::Result<u64> {
    result.map_err(io::Error::from_raw_os_error)
}

/// One kind of librbd request, submitted with its completion.
enum Op {
    Read(u64),
    Write(u64),
    Flush,
    Discard(u64, u64),
    WriteZeroes(u64, u64, bool),
}

impl RbdQueue {
    /// A queue of requests to `image` whose ends run on `ctx`'s loop.
    pub fn new<L: EventLoop + 'static>(image: Arc<RbdImage>, ctx: &AioContext<L>) -> Self {
        let waiting = Rc::new(RefCell::new(Waiting::default()));
        let mailbox = Arc::new_cyclic(|weak: &std::sync::Weak<Mailbox>| {
            let (weak, waiting, image) = (weak.clone(), Rc::downgrade(&waiting), image.clone());
            let bh = ctx.bh_new(move |_| {
                if let (Some(mailbox), Some(waiting)) = (weak.upgrade(), waiting.upgrade()) {
                    deliver(&image, &mailbox, &waiting);
                }
            });
            Mailbox {
                finished: Mutex::new(Vec::new()),
                bh,
            }
        });
        RbdQueue {
            image,
            mailbox,
            waiting,
        }
    }

    /// The image.
    pub fn image(&self) -> &Arc<RbdImage> {
        &self.image
    }

    /// Requests submitted on this queue that have not yet ended.
    pub fn waiting(&self) -> usize {
        self.waiting.borrow().by_token.len()
    }

    /// Reads `memory.len()` bytes at `offset` into `memory`; `done` gets the bytes read and
    /// the memory back.
    pub fn read(
        &self,
        offset: u64,
        memory: Memory,
        done: impl FnOnce(io::Result<usize>, Memory) + 'static,
    ) {
        let waiter = Waiter::Done(Box::new(move |r, payload| {
            let Payload::Memory(m) = payload else {
                unreachable!("a read's memory comes back with it")
            };
            done(as_io(r).map(|n| n as usize), m)
        }));
        self.submit(Op::Read(offset), Some(memory), waiter);
    }

    /// Writes `memory` at `offset`; with `fua` the data is durable when `done` runs (a flush
    /// follows the write, as QEMU emulates FUA on RBD).
    pub fn write(
        &self,
        offset: u64,
        memory: Memory,
        fua: bool,
        done: impl FnOnce(io::Result<()>, Memory) + 'static,
    ) {
        let done: Box<dyn FnOnce(Result<u64, i32>, Payload)> = Box::new(move |r, payload| {
            let Payload::Memory(m) = payload else {
                unreachable!("a write's memory comes back with it")
            };
            done(as_io(r).map(drop), m)
        });
        let waiter = match fua {
            true => Waiter::FlushThen(done),
            false => Waiter::Done(done),
        };
        self.submit(Op::Write(offset), Some(memory), waiter);
    }

    /// Makes every write that has ended durable (librbd's cache written back).
    pub fn flush(&self, done: impl FnOnce(io::Result<()>) + 'static) {
        let waiter = Waiter::Done(Box::new(move |r, _| done(as_io(r).map(drop))));
        self.submit(Op::Flush, None, waiter);
    }

    /// Lets the image forget `len` bytes at `offset`: advisory, as a discard is (librbd
    /// ignores what is smaller than `rbd_discard_granularity_bytes`, 64 KiB by default; what
    /// it does discard reads as zeros after).
    pub fn discard(&self, offset: u64, len: u64, done: impl FnOnce(io::Result<()>) + 'static) {
        let waiter = Waiter::Done(Box::new(move |r, _| done(as_io(r).map(drop))));
        self.submit(Op::Discard(offset, len), None, waiter);
    }

    /// Makes `len` bytes at `offset` read as zeros; without `unmap` they stay allocated
    /// (`RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`, as QEMU asks when unmapping is not allowed).
    pub fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        unmap: bool,
        done: impl FnOnce(io::Result<()>) + 'static,
    ) {
        let waiter = Waiter::Done(Box::new(move |r, _| done(as_io(r).map(drop))));
        self.submit(Op::WriteZeroes(offset, len, unmap), None, waiter);
    }

    /// The allocated extents `(offset, length)` of `[offset, offset + len)`, found on the
    /// image's worker thread ([`RbdImage::allocated`]) and told to `done` on this loop.
    pub fn allocated(
        &self,
        offset: u64,
        len: u64,
        done: impl FnOnce(Result<Vec<(u64, u64)>, RbdError>) + 'static,
    ) {
        let token = self.wait_for(Waiter::Done(Box::new(move |_, payload| {
            let Payload::Extents(extents) = payload else {
                unreachable!("block status comes back with extents")
            };
            done(extents)
        })));
        let (image, mailbox) = (self.image.clone(), self.mailbox.clone());
        self.image.run_on_worker(Box::new(move || {
            let extents = image.allocated(offset, len);
            mailbox.post(token, 0, Payload::Extents(extents));
        }));
    }

    fn wait_for(&self, waiter: Waiter) -> u64 {
        let mut waiting = self.waiting.borrow_mut();
        let token = waiting.next;
        waiting.next += 1;
        waiting.by_token.insert(token, waiter);
        token
    }

    fn submit(&self, op: Op, memory: Option<Memory>, waiter: Waiter) {
        let token = self.wait_for(waiter);
        submit_op(&self.image, &self.mailbox, token, op, memory);
    }
}

/// Hands `op` to librbd, its end to come through `mailbox` with `token` (a refusal too).
fn submit_op(image: &RbdImage, mailbox: &Arc<Mailbox>, token: u64, op: Op, memory: Option<Memory>) {
    if !image.begin_request() {
        let payload = memory.map_or(Payload::None, Payload::Memory);
        return mailbox.post(token, -i64::from(libc::EBADF), payload);
    }
    let lib = image.lib;
    let iov_of = |m: &Option<Memory>| {
        let iov = m.as_ref().map_or(&[][..], |m| m.iov.as_iovecs());
        (iov.as_ptr(), iov.len() as i32)
    };
    let (iov, iovcnt) = iov_of(&memory);
    let flight = Box::into_raw(Box::new(InFlight {
        mailbox: mailbox.clone(),
        image,
        token,
        memory,
    }));
    let mut c: sys::RbdCompletion = std::ptr::null_mut();
    // SAFETY: `flight` is a live box handed to librbd as the callback's argument; a live
    // out-pointer for the completion.
    let mut ret = unsafe { (lib.rbd_aio_create_completion)(flight.cast(), request_done, &mut c) };
    if ret >= 0 {
        let h = image.handle;
        // SAFETY: an open image (counted in flight, so not closed); the iovecs are the
        // memory's, which lives in `flight` until the callback (the promise of
        // `GuestIovecs::new`); `c` is fresh and given to exactly one request.
        ret = unsafe {
            match op {
                Op::Read(offset) => (lib.rbd_aio_readv)(h, iov, iovcnt, offset, c),
                Op::Write(offset) => (lib.rbd_aio_writev)(h, iov, iovcnt, offset, c),
                Op::Flush => (lib.rbd_aio_flush)(h, c),
                Op::Discard(offset, len) => (lib.rbd_aio_discard)(h, offset, len, c),
                Op::WriteZeroes(offset, len, unmap) => {
                    let flags = if unmap { 0 } else { sys::WRITE_ZEROES_THICK };
                    (lib.rbd_aio_write_zeroes)(h, offset, len as usize, c, flags, 0)
                }
            }
        };
        if ret < 0 {
            // SAFETY: librbd refused the request, so it will never call `c` back: released
            // once, here.
            unsafe { (lib.rbd_aio_release)(c) };
        }
    }
    if ret < 0 {
        // SAFETY: the callback will never run (no completion, or it was refused), so the box
        // is still ours, taken back once.
        let flight = unsafe { Box::from_raw(flight) };
        let payload = flight.memory.map_or(Payload::None, Payload::Memory);
        mailbox.post(token, ret.into(), payload);
        image.end_request();
    }
}

/// The bottom half: every finished request's caller told, on the loop.
fn deliver(image: &RbdImage, mailbox: &Arc<Mailbox>, waiting: &Rc<RefCell<Waiting>>) {
    loop {
        let batch =
            std::mem::take(&mut *mailbox.finished.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            return;
        }
        for f in batch {
            let waiter = waiting.borrow_mut().by_token.remove(&f.token);
            let result = check(f.ret);
            match waiter {
                Some(Waiter::FlushThen(done)) if result.is_ok() => {
                    waiting
                        .borrow_mut()
                        .by_token
                        .insert(f.token, Waiter::Done(done));
                    let memory = match f.payload {
                        Payload::Memory(m) => Some(m),
                        _ => None,
                    };
                    submit_op(image, mailbox, f.token, Op::Flush, memory);
                }
                Some(Waiter::Done(done) | Waiter::FlushThen(done)) => done(result, f.payload),
                None => {}
            }
        }
    }
}

impl Drop for RbdQueue {
    fn drop(&mut self) {
        // Requests still in flight end in librbd's callbacks, which free their memory; their
        // callers are not told (the queue, and with it the loop's side, is gone).
        self.mailbox.bh.delete();
    }
}
