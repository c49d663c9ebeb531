//! One virtqueue served on one `AioContext`: kicks in, requests out to the engine, completions
//! back into the used ring, one interrupt per batch.
//!
//! This module owns a queue's data path and nothing of the transport: a VMM with its own
//! virtio transport hands it a [`virtio_queue::Queue`], the guest memory, the kick eventfd and
//! the call eventfd (an irqfd), and gets the same device vhost-user serves.
//!
//! * **Kicks are handlers of the loop.** The kick eventfd is an fd handler with `io_read`,
//!   and with an `io_poll` that compares the avail index with the next one to take, reading
//!   guest memory only (QEMU's `virtio_queue_host_notifier_aio_poll`), so an iothread that
//!   busy-polls takes requests without a kick.
//! * **Polling mode switches notifications.** `io_poll_begin` tells the driver not to kick
//!   (`VRING_USED_F_NO_NOTIFY`, or the avail event with `EVENT_IDX`), `io_poll_end` turns
//!   kicks back on; the loop checks the queue once more after the end, so nothing queued
//!   meanwhile waits.
//! * **Requests go straight to guest memory.** Reads and writes are `readv`/`writev` over the
//!   chain's data descriptors (no copy), submitted with their own completion callback inside
//!   one plugged batch per kick. A request the engine refuses for `O_DIRECT` alignment (a
//!   driver's buffer not aligned to the image's block) goes through an aligned bounce buffer.
//! * **Guest memory outlives its requests.** Each request holds the memory table it was
//!   parsed against (an `Arc` of the mappings) until its completion, so a new table or a
//!   disconnect never unmaps memory the kernel may still write.
//! * **One interrupt per batch.** A completion writes the status byte and the used ring and
//!   calls a deferred call; it raises the call eventfd once at the end of the batch, and only
//!   when the driver asked for it (`EVENT_IDX`'s used event, or no `NO_INTERRUPT` flag), as
//!   QEMU defers `virtio_notify_irqfd()` with `defer_call()`. A queue's start raises it once
//!   whatever the driver asked (unless starting already did): a device that died between
//!   publishing used elements and signalling them left the driver waiting for completions
//!   that are in the used ring already.
//! * **Requests in flight can be recorded.** With an [`InflightLog`] a queue marks each head
//!   before its request is submitted and clears it after its used element is published, and
//!   it starts by resubmitting the heads an earlier device left in flight (vhost-user's
//!   in-flight I/O tracking, for a backend that restarts under a running guest).
//! * **What the device writes can be logged.** With a [`DirtyTracking`] a queue reports
//!   every guest page it writes (a read's data, status bytes, the used ring), before the
//!   used index publishes it ([`crate::dirty`]: vhost-user's dirty log, for live migration).
//! * **A bad chain is the driver's error, not ours.** It is answered `IOERR` (or `UNSUPP`) and
//!   the queue goes on; a ring the device cannot read or write at all marks the queue broken
//!   (QEMU's `virtio_error()`): it takes no more requests until it is set up again.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{self, Read, Write};
use std::num::Wrapping;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AttachedEngine;
use aio_loop::{AioContext, DeferredCall, FdHandler};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::chain::{parse_chain, parse_head, BlkRequest, RefusedChain};
use crate::device::BlockDevice;
use crate::dirty::{DirtyTracking, Reports};
use crate::inflight::{Inflight, InflightLog};
use crate::request::{record_done, record_invalid, RingTag, Store};
use aio_block::request::Reply;
use aio_block::stats::Recorder;

pub use crate::chain::GuestMemory;

/// What a queue has done, for tests and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Requests taken from the avail ring.
    pub requests: u64,
    /// Chains refused (answered `IOERR` / `UNSUPP`, or returned with no status).
    pub refused: u64,
    /// Requests that went through a bounce buffer (misaligned for `O_DIRECT`).
    pub bounced: u64,
    /// Call eventfd writes (interrupts raised).
    pub interrupts: u64,
    /// Kicks read from the kick eventfd.
    pub kicks: u64,
    /// Times busy polling found requests (no kick needed).
    pub poll_hits: u64,
    /// Requests run again at the start, from the in-flight log of an earlier device.
    pub resubmitted: u64,
}

/// Everything a queue needs to start ([`VirtioBlkQueue::start_with`]); `Send`, so a transport
/// builds it on its control thread and hands it to the queue's iothread.
#[derive(Debug)]
#[non_exhaustive]
pub struct QueueSetup {
    /// The disk.
    pub device: Arc<BlockDevice>,
    /// The ring, set up and ready: size, addresses, event idx, next avail and next used index.
    pub queue: Queue,
    /// The guest memory table.
    pub memory: GuestMemory,
    /// The kick eventfd.
    pub kick: File,
    /// The call eventfd (none: the driver polls the used ring).
    pub call: Option<File>,
    /// The in-flight log and the heads to resubmit, if the transport keeps one.
    pub inflight: Option<Inflight>,
    /// Where the guest memory the device writes is reported, if anywhere.
    pub dirty: Option<DirtyTracking>,
}

impl QueueSetup {
    /// A setup without an in-flight log.
    pub fn new(
        device: Arc<BlockDevice>,
        queue: Queue,
        memory: GuestMemory,
        kick: File,
        call: Option<File>,
    ) -> Self {
        QueueSetup {
            device,
            queue,
            memory,
            kick,
            call,
            inflight: None,
            dirty: None,
        }
    }

    /// Records the queue's requests in `inflight.log` and resubmits `inflight.resubmit` first.
    pub fn with_inflight(mut self, inflight: Inflight) -> Self {
        self.inflight = Some(inflight);
        self
    }

    /// Reports the guest memory the device writes to `dirty` ([`crate::dirty`]).
    pub fn with_dirty_tracking(mut self, dirty: DirtyTracking) -> Self {
        self.dirty = Some(dirty);
        self
    }
}

/// Why a queue could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The rings are not inside guest memory, or the size is not a power of two.
    #[error("the queue's rings are not valid in guest memory")]
    InvalidRings,
    /// The kick fd could not be registered with the loop.
    #[error("registering the kick fd: {0}")]
    Register(#[from] aio_core::AioError),
    /// An fd could not be set up (non-blocking mode).
    #[error("kick fd: {0}")]
    Fd(#[from] io::Error),
}

/// One virtio-blk queue served on a context `L` with engine `E`. `!Send`: it lives on its
/// iothread. [`VirtioBlkQueue::stop`] drains it.
pub struct VirtioBlkQueue<L: EventLoop + 'static, E: IoEngine + 'static> {
    inner: Rc<Inner<L, E>>,
}

/// The ring side of a queue: what it takes, what it completes, when it interrupts. The
/// requests themselves run on `store`.
struct Inner<L: EventLoop + 'static, E: IoEngine + 'static> {
    store: Store<L, E>,
    queue: RefCell<Queue>,
    mem: RefCell<GuestMemory>,
    kick: File,
    call: RefCell<Option<File>>,
    interrupt: RefCell<Option<DeferredCall>>,
    in_flight: Cell<usize>,
    /// Where taken heads are recorded, if anywhere.
    log: RefCell<Option<Box<dyn InflightLog>>>,
    /// Where the guest memory written is reported, if anywhere.
    dirty: Reports,
    /// Polling mode: the driver was told not to kick.
    polling: Cell<bool>,
    broken: Cell<bool>,
    stats: Cell<QueueStats>,
    /// Where this queue counts the disk's I/O statistics.
    recorder: Recorder,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> VirtioBlkQueue<L, E> {
    /// Starts serving `queue` (set up and ready: size, ring addresses, event idx, next avail
    /// index) of `device` on `ctx`: registers `kick` and takes what the avail ring already
    /// holds. `call` is the interrupt eventfd (none: the driver polls the used ring).
    pub fn start(
        ctx: &AioContext<L>,
        engine: AttachedEngine<L, E>,
        device: Arc<BlockDevice>,
        queue: Queue,
        mem: GuestMemory,
        kick: File,
        call: Option<File>,
    ) -> Result<Self, QueueError> {
        let setup = QueueSetup::new(device, queue, mem, kick, call);
        Self::start_with(ctx, engine, setup)
    }

    /// [`VirtioBlkQueue::start`] from a [`QueueSetup`]; with an in-flight log, the heads to
    /// resubmit run before anything is taken from the avail ring.
    pub fn start_with(
        ctx: &AioContext<L>,
        engine: AttachedEngine<L, E>,
        setup: QueueSetup,
    ) -> Result<Self, QueueError> {
        let QueueSetup {
            device,
            queue,
            memory: mem,
            kick,
            call,
            inflight,
            dirty,
        } = setup;
        if !queue.is_valid(&*mem) {
            return Err(QueueError::InvalidRings);
        }
        set_nonblocking(&kick)?;
        let (log, resubmit) = match inflight {
            Some(Inflight { log, resubmit }) => (Some(log), resubmit),
            None => (None, Vec::new()),
        };
        let recorder = Recorder::new(device.stats(), queue.size());
        let inner = Rc::new(Inner {
            recorder,
            store: Store::new(device, engine),
            queue: RefCell::new(queue),
            mem: RefCell::new(mem),
            kick,
            call: RefCell::new(call),
            interrupt: RefCell::new(None),
            in_flight: Cell::new(0),
            log: RefCell::new(log),
            dirty: Reports::new(dirty),
            polling: Cell::new(false),
            broken: Cell::new(false),
            stats: Cell::new(QueueStats::default()),
        });
        let weak = Rc::downgrade(&inner);
        *inner.interrupt.borrow_mut() = Some(ctx.deferred_call(move || {
            if let Some(q) = weak.upgrade() {
                q.notify_driver();
            }
        }));
        let handler = kick_handler(&inner);
        ctx.set_fd_handler(inner.kick.as_fd(), handler)?;
        let interrupts = inner.stats.get().interrupts;
        inner.resubmit(ctx, &resubmit);
        // Requests queued before the kick fd was ours would wait for the next kick.
        inner.process(ctx);
        // A device that died between publishing used elements and raising their interrupt
        // (one per batch, at its end) left the driver waiting for completions that are in
        // the used ring already: make it look, unless starting did so. A spurious interrupt
        // costs the driver one look at the used ring.
        if inner.stats.get().interrupts == interrupts {
            inner.raise_interrupt();
        }
        Ok(VirtioBlkQueue { inner })
    }

    /// Stops taking requests, waits (running `ctx`) until every request taken has completed
    /// into the used ring, and returns the next avail index (vhost-user's vring base).
    pub fn stop(self, ctx: &AioContext<L>) -> u16 {
        let _ = ctx.remove_fd_handler(self.inner.kick.as_fd());
        while self.inner.in_flight.get() > 0 {
            ctx.poll(true);
        }
        self.inner.notify_driver();
        let next = self.inner.queue.borrow().next_avail();
        next
    }

    /// Replaces the guest memory table (requests in flight keep the one they started with).
    pub fn set_memory(&self, mem: GuestMemory) {
        *self.inner.mem.borrow_mut() = mem;
    }

    /// Replaces the call eventfd.
    pub fn set_call(&self, call: Option<File>) {
        *self.inner.call.borrow_mut() = call;
    }

    /// Replaces where the guest memory the device writes is reported (none: nowhere); the
    /// requests in flight report their later writes to the new one.
    pub fn set_dirty_tracking(&self, dirty: Option<DirtyTracking>) {
        self.inner.dirty.set(dirty);
    }

    /// Requests taken and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.get()
    }

    /// Whether the queue stopped taking requests because its rings could not be used.
    pub fn is_broken(&self) -> bool {
        self.inner.broken.get()
    }

    /// What it has done.
    pub fn stats(&self) -> QueueStats {
        self.inner.stats.get()
    }
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Reply for Inner<L, E> {
    type Tag = RingTag;

    fn finish(&self, (mem, request): RingTag, result: io::Result<()>) {
        let status = match result {
            Ok(()) => crate::spec::S_OK,
            Err(_) => crate::spec::S_IOERR,
        };
        record_done(&self.recorder, &request, status);
        self.dirty.request_done(&request);
        let len = if status == crate::spec::S_OK {
            request.written_len()
        } else {
            1
        };
        self.complete(&mem, request.head, request.status, status, len);
    }

    fn bounced(&self) {
        self.bump(|s| s.bounced += 1);
    }
}

/// The kick fd's handler: `io_read` on a kick, `io_poll` on the avail index, notifications
/// off and on around polling mode.
fn kick_handler<L: EventLoop + 'static, E: IoEngine + 'static>(
    inner: &Rc<Inner<L, E>>,
) -> FdHandler<L> {
    let (on_read, on_poll, on_ready) = (inner.clone(), inner.clone(), inner.clone());
    let (on_begin, on_end) = (inner.clone(), inner.clone());
    FdHandler::new()
        .on_read(move |ctx| {
            // The eventfd's counter (non-blocking: a nested loop may have drained it already).
            let mut counter = [0u8; 8];
            if (&on_read.kick).read(&mut counter).ok() == Some(8) {
                on_read.bump(|s| s.kicks += 1);
            }
            on_read.process(ctx);
        })
        .on_poll(move || on_poll.has_avail())
        .on_poll_ready(move |ctx| {
            on_ready.bump(|s| s.poll_hits += 1);
            on_ready.process(ctx);
        })
        .on_poll_begin(move || on_begin.set_polling(true))
        .on_poll_end(move || on_end.set_polling(false))
}

fn set_nonblocking(f: &File) -> io::Result<()> {
    let fd = f.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on an fd we own; no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Inner<L, E> {
    fn bump(&self, f: impl FnOnce(&mut QueueStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Whether the avail ring holds requests not taken yet (guest memory only, no syscall).
    fn has_avail(&self) -> bool {
        if self.broken.get() {
            return false;
        }
        let mem = self.mem.borrow();
        let queue = self.queue.borrow();
        match queue.avail_idx(&**mem, Ordering::Acquire) {
            Ok(avail) => avail != Wrapping(queue.next_avail()),
            Err(_) => false,
        }
    }

    fn set_polling(&self, on: bool) {
        self.polling.set(on);
        let mem = self.mem.borrow().clone();
        let mut queue = self.queue.borrow_mut();
        let _ = if on {
            queue.disable_notification(&*mem)
        } else {
            queue.enable_notification(&*mem).map(drop)
        };
        self.dirty.notification(&queue);
    }

    /// Takes every request the avail ring holds (QEMU's `virtio_blk_handle_vq`): with kicks
    /// off while it drains, unless polling mode already turned them off.
    fn process(self: &Rc<Self>, ctx: &AioContext<L>) {
        self.recorder.batch_end();
        let _section = ctx.defer_section();
        self.store.plug();
        while !self.broken.get() {
            let mem = self.mem.borrow().clone();
            let polling = self.polling.get();
            let taken = self.take_requests(&mem, polling);
            self.store
                .prefetch(taken.iter().filter_map(|r| r.as_ref().ok()));
            for request in taken {
                self.start_request(ctx, &mem, request);
            }
            if polling {
                break;
            }
            // Kicks back on; requests that came in meanwhile are taken now.
            match self.queue.borrow_mut().enable_notification(&*mem) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(_) => self.mark_broken(),
            }
        }
        self.store.finish_batch(ctx);
        // Draining turned notifications off and on.
        self.dirty.notification(&self.queue.borrow());
        // The batch taken ends: completions that come later read the clock again.
        self.recorder.batch_end();
    }

    /// Pops and checks every available chain.
    fn take_requests(
        &self,
        mem: &GuestMemory,
        polling: bool,
    ) -> Vec<Result<BlkRequest, RefusedChain>> {
        let limits = self.store.device().chain_limits();
        let mut queue = self.queue.borrow_mut();
        if !polling && queue.disable_notification(&**mem).is_err() {
            drop(queue);
            self.mark_broken();
            return Vec::new();
        }
        let mut taken = Vec::new();
        match queue.iter(mem.clone()) {
            Ok(iter) => {
                for chain in iter {
                    self.log_taken(chain.head_index());
                    taken.push(parse_chain(chain, mem, &limits));
                }
            }
            // The avail index moved by more than the queue size: the driver broke the ring.
            Err(_) => {
                drop(queue);
                self.mark_broken();
            }
        }
        taken
    }

    /// Runs the heads an earlier device left in flight, in the order given, as requests
    /// taken now (the ring's next avail index already counts them).
    fn resubmit(self: &Rc<Self>, ctx: &AioContext<L>, heads: &[u16]) {
        if heads.is_empty() {
            return;
        }
        let _section = ctx.defer_section();
        self.store.plug();
        let mem = self.mem.borrow().clone();
        let (table, size) = {
            let queue = self.queue.borrow();
            (GuestAddress(queue.desc_table()), queue.size())
        };
        let limits = self.store.device().chain_limits();
        for &head in heads {
            self.log_taken(head);
            self.bump(|s| s.resubmitted += 1);
            let request = parse_head(&mem, table, size, head, &limits);
            self.start_request(ctx, &mem, request);
        }
        self.store.finish_batch(ctx);
    }

    fn log_taken(&self, head: u16) {
        if let Some(log) = self.log.borrow_mut().as_mut() {
            log.taken(head);
        }
    }

    fn mark_broken(&self) {
        self.broken.set(true);
    }

    /// Counts `request` in flight and runs it; a chain refused by the parser is answered
    /// here (its status, or none if even that cannot be written).
    fn start_request(
        self: &Rc<Self>,
        ctx: &AioContext<L>,
        mem: &GuestMemory,
        request: Result<BlkRequest, RefusedChain>,
    ) {
        self.bump(|s| s.requests += 1);
        self.in_flight.set(self.in_flight.get() + 1);
        match request {
            Ok(request) => {
                self.recorder.taken(request.head);
                self.store.execute(ctx, self, mem, request)
            }
            Err(refused) => {
                self.bump(|s| s.refused += 1);
                record_invalid(&self.recorder, refused.request_type);
                match refused.status {
                    Some(status) => {
                        self.complete(mem, refused.head, status, refused.error.status(), 1)
                    }
                    None => self.complete_without_status(mem, refused.head),
                }
            }
        }
    }

    /// Writes the status byte, puts the head in the used ring, asks for an interrupt.
    fn complete(
        &self,
        mem: &GuestMemory,
        head: u16,
        status_at: GuestAddress,
        status: u8,
        len: u32,
    ) {
        // One byte never crosses a region: the region's slice, not vm-memory's iterator over
        // regions (which the compiler may leave out of line on this hot path).
        let written = mem
            .get_slice(status_at, 1)
            .and_then(|slice| slice.write_obj(status, 0).map_err(Into::into));
        if written.is_err() {
            return self.complete_without_status(mem, head);
        }
        self.dirty.status(status_at.0);
        self.add_used(mem, head, len);
    }

    fn complete_without_status(&self, mem: &GuestMemory, head: u16) {
        self.add_used(mem, head, 0);
    }

    fn add_used(&self, mem: &GuestMemory, head: u16, len: u32) {
        self.in_flight.set(self.in_flight.get().saturating_sub(1));
        let mut log = self.log.borrow_mut();
        if let Some(log) = log.as_mut() {
            log.completing(head);
        }
        let mut queue = self.queue.borrow_mut();
        let slot = queue.next_used();
        if queue.add_used(&**mem, head, len).is_err() {
            drop(queue);
            self.mark_broken();
            return;
        }
        self.dirty.used(&queue, slot);
        if let Some(log) = log.as_mut() {
            log.completed(head, queue.next_used());
        }
        drop((queue, log));
        if let Some(interrupt) = self.interrupt.borrow().as_ref() {
            interrupt.call();
        }
    }

    /// Raises the call eventfd if the driver wants an interrupt now.
    fn notify_driver(&self) {
        // The batch of completions ends here: the next one reads the clock again.
        self.recorder.batch_end();
        let mem = self.mem.borrow().clone();
        let wanted = self
            .queue
            .borrow_mut()
            .needs_notification(&*mem)
            .unwrap_or(true);
        if wanted {
            self.raise_interrupt();
        }
    }

    /// Writes the call eventfd.
    fn raise_interrupt(&self) {
        if let Some(mut call) = self.call.borrow().as_ref() {
            if call.write(&1u64.to_ne_bytes()).ok() == Some(8) {
                self.bump(|s| s.interrupts += 1);
            }
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
