//! One image served on one context of this thread, each request run to its end: what the
//! request tests share.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio::poll::PollLoop;
use aio::{AioContext, IoEngine};
use aio_block::request::ReturnedBuf;
use aio_block::{BlockRequest, Image, ImageQueue, LentMemory, Reply};
use aio_core::engine::AlignedBuf;

/// Each request's end, by tag, and the bounces counted.
#[derive(Default)]
pub struct Ends {
    pub done: RefCell<Vec<(u32, io::Result<()>)>>,
    pub bounced: Cell<u32>,
}

impl Reply for Ends {
    type Tag = u32;

    fn finish(&self, tag: u32, result: io::Result<()>) {
        self.done.borrow_mut().push((tag, result));
    }

    fn bounced(&self) {
        self.bounced.set(self.bounced.get() + 1);
    }
}

/// One image served on one context of this thread.
pub struct Session {
    pub ctx: AioContext<PollLoop>,
    pub queue: ImageQueue<PollLoop, Box<dyn IoEngine>>,
    pub ends: Rc<Ends>,
    next: Cell<u32>,
}

impl Session {
    pub fn new(image: &Arc<Image>, engine: Box<dyn IoEngine>) -> Self {
        let ctx = AioContext::new(PollLoop::new()).unwrap();
        let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
        Session {
            queue: image.queue(engine),
            ctx,
            ends: Rc::default(),
            next: Cell::new(0),
        }
    }

    /// Submits `request` in a batch of its own and runs the loop until it has ended.
    pub fn run(&self, request: BlockRequest) -> io::Result<()> {
        let tag = self.next.get();
        self.next.set(tag + 1);
        self.queue.plug();
        self.queue.submit(&self.ctx, &self.ends, request, tag);
        self.queue.unplug(&self.ctx);
        loop {
            let mut done = self.ends.done.borrow_mut();
            if let Some(at) = done.iter().position(|(t, _)| *t == tag) {
                return done.remove(at).1;
            }
            drop(done);
            self.ctx.poll(true);
        }
    }

    pub fn read(&self, offset: u64, len: usize) -> (io::Result<()>, Vec<u8>) {
        let mut buf = AlignedBuf::new(len);
        buf.fill(0xee);
        let (buffers, back) = LentMemory::from_aligned(buf);
        let result = self.run(BlockRequest::Read { offset, buffers });
        (result, taken(back))
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let (buffers, _) = LentMemory::from_aligned(AlignedBuf::from_slice(data));
        self.run(BlockRequest::Write {
            offset,
            buffers,
            fua,
        })
    }
}

/// The buffer back from a request that has ended.
pub fn taken(back: ReturnedBuf) -> Vec<u8> {
    match back.take() {
        Ok(buf) => buf.to_vec(),
        Err(_) => panic!("a request's buffer is still held after its end"),
    }
}

/// The errno a request ended with, if it failed.
pub fn errno(result: io::Result<()>) -> Option<i32> {
    result.err().and_then(|e| e.raw_os_error())
}
