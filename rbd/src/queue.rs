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
//! * **Memory librbd may write stays alive.** A read's or write's [`LentMemory`] travels with the
//!   request into librbd and comes back only from the callback, after librbd is done with
//!   it; a queue dropped with requests in flight leaves their memory to the callbacks, which
//!   free it then. The image's close waits for every callback.
//! * **Each request ends once,** on the loop, never inside the submitting call (a refused
//!   submission ends through the bottom half too).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use aio_core::engine::LentMemory;
use aio_core::EventLoop;
use aio_loop::{AioContext, BottomHalf};

use crate::error::{check, RbdError};
use crate::image::RbdImage;
use crate::submit::{submit, Deliver, RbdOp};

/// What came back with a finished request.
pub(crate) enum Payload {
    None,
    Memory(LentMemory),
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

impl Deliver for Mailbox {
    fn deliver(&self, token: u64, ret: i64, memory: Option<LentMemory>) {
        self.post(token, ret, memory.map_or(Payload::None, Payload::Memory));
    }
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
        memory: LentMemory,
        done: impl FnOnce(io::Result<usize>, LentMemory) + 'static,
    ) {
        let waiter = Waiter::Done(Box::new(move |r, payload| {
            let Payload::Memory(m) = payload else {
                unreachable!("a read's memory comes back with it")
            };
            done(as_io(r).map(|n| n as usize), m)
        }));
        self.submit(RbdOp::Read(offset), Some(memory), waiter);
    }

    /// Writes `memory` at `offset`; with `fua` the data is durable when `done` runs (a flush
    /// follows the write, as QEMU emulates FUA on RBD).
    pub fn write(
        &self,
        offset: u64,
        memory: LentMemory,
        fua: bool,
        done: impl FnOnce(io::Result<()>, LentMemory) + 'static,
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
        self.submit(RbdOp::Write(offset), Some(memory), waiter);
    }

    /// Makes every write that has ended durable (librbd's cache written back).
    pub fn flush(&self, done: impl FnOnce(io::Result<()>) + 'static) {
        let waiter = Waiter::Done(Box::new(move |r, _| done(as_io(r).map(drop))));
        self.submit(RbdOp::Flush, None, waiter);
    }

    /// Lets the image forget `len` bytes at `offset`: advisory, as a discard is (librbd
    /// ignores what is smaller than `rbd_discard_granularity_bytes`, 64 KiB by default; what
    /// it does discard reads as zeros after).
    pub fn discard(&self, offset: u64, len: u64, done: impl FnOnce(io::Result<()>) + 'static) {
        let waiter = Waiter::Done(Box::new(move |r, _| done(as_io(r).map(drop))));
        self.submit(RbdOp::Discard(offset, len), None, waiter);
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
        self.submit(RbdOp::WriteZeroes { offset, len, unmap }, None, waiter);
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

    fn submit(&self, op: RbdOp, memory: Option<LentMemory>, waiter: Waiter) {
        let token = self.wait_for(waiter);
        submit(&self.image, self.mailbox.clone(), token, op, memory);
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
                    submit(image, mailbox.clone(), f.token, RbdOp::Flush, memory);
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
