//! The iothread's side of a matrix cell: the virtqueues it serves and its engine.
//!
//! This module owns what runs on one iothread: [`Station`] sets the iothread's context up (its
//! polling, the engine attached, a doorbell handler per virtqueue it serves) and takes it down
//! again; [`HostQueue`] takes a virtqueue's requests into the engine, pointing into guest RAM
//! (or, with `--bounce`, through its own buffers), and puts each completion on the used ring,
//! raising the queue's interrupt at once or, with `--batch-interrupts`, once per batch of
//! completions ([`IrqBatch`]). It never starts a thread: `scsi/run.rs` decides which thread a
//! station lives on.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use aio_core::engine::{
    AlignedBuf, AttachedEngine, Completion, GuestIovecs, IoBuffers, IoEngine, IoFile, Request,
};
use aio_core::{AioContext, DeferredCall, EventLoop, FdHandler};

use super::memory::GuestRam;
use super::{CellSpec, GuestRequest, MemoryPath, UsedEntry, Virtqueue};

/// One virtqueue as handed to the iothread that serves it (`Send`: it is built on the
/// calling thread and moved to the iothread).
pub(super) struct QueuePlace {
    /// The disk the queue belongs to.
    pub(super) disk: usize,
    /// The queue.
    pub(super) vq: Arc<Virtqueue>,
    /// The disk's image.
    pub(super) file: IoFile,
    /// The disk's first byte in `file` (its image may be a device region).
    pub(super) base: u64,
    /// Whether the guest drives the disk (only driven disks need bounce buffers).
    pub(super) driven: bool,
}

/// The iothread's view of one virtqueue: the queue, where its disk's blocks are, and the
/// memory its requests use.
struct HostQueue {
    disk: usize,
    vq: Arc<Virtqueue>,
    file: IoFile,
    base: u64,
    ram: Arc<GuestRam>,
    memory: MemoryPath,
    /// With `--bounce`, a buffer per slot of the driven disk, home while the slot has no
    /// request in flight on this queue (empty on the guest-memory path and for idle disks).
    /// Each queue has its own: a slot's request may come on any of the disk's queues, and
    /// they may be on different iothreads.
    bounce: RefCell<Vec<Option<AlignedBuf>>>,
    /// With `--batch-interrupts`, where its interrupts wait for the end of the batch.
    irq_batch: Option<Rc<IrqBatch>>,
    /// Whether an interrupt of this queue waits in `irq_batch`.
    irq_pending: Cell<bool>,
}

impl HostQueue {
    /// Takes the available ring's requests into the engine, one plugged batch.
    fn process<L: EventLoop + 'static, E: IoEngine + 'static>(
        self: &Rc<Self>,
        engine: &AttachedEngine<L, E>,
    ) {
        let taken = self.vq.take_avail();
        if taken.is_empty() {
            return;
        }
        engine.plug();
        for r in taken {
            self.submit(engine, r);
        }
        engine.unplug();
    }

    /// Submits one guest request, its completion going to [`HostQueue::complete`]; a request
    /// the engine refuses goes straight to the used ring as `EINVAL`.
    fn submit<L: EventLoop + 'static, E: IoEngine + 'static>(
        self: &Rc<Self>,
        engine: &AttachedEngine<L, E>,
        r: GuestRequest,
    ) {
        let queue = self.clone();
        let (slot, write) = (r.slot, r.write);
        let sent = engine.submit_with(self.request(r), move |_, _, c| {
            queue.complete(slot, write, c)
        });
        if let Err(e) = sent {
            self.take_back(slot, 0, e.request.op.into_buffers());
            self.vq.push_used(UsedEntry {
                slot,
                result: -(libc::EINVAL as i64),
            });
        }
    }

    /// The engine's request for `r`: pointing into the slot's guest RAM, or with `--bounce`
    /// on the slot's buffer (for a write, a copy of the slot's guest RAM).
    fn request(&self, r: GuestRequest) -> Request {
        let token = ((self.disk as u64) << 32) | r.slot as u64;
        // The guest's offsets are the disk's; its image may be a device region.
        let offset = self.base + r.offset;
        if self.memory == MemoryPath::Guest {
            let mem = self.ram.slot_ptr(self.disk, r.slot);
            // SAFETY: the slot is the iothread's from the available ring to the used ring
            // (`GuestRam`): the guest does not touch it until `complete` has put the entry on
            // the used ring, after the engine handed these iovecs back. The mapping is removed
            // only after every engine is dropped (`scsi/run.rs` keeps a reference to it until
            // every iothread's context, which owns its engine, is gone).
            let mem = unsafe { GuestIovecs::from_raw_parts(mem, self.ram.bs()) };
            return if r.write {
                Request::write_guest(&self.file, offset, mem, token)
            } else {
                Request::read_guest(&self.file, offset, mem, token)
            };
        }
        let mut buf = self.bounce.borrow_mut()[r.slot as usize]
            .take()
            .expect("a slot's buffer is home while the guest may reuse it");
        if r.write {
            // SAFETY: the slot is the iothread's until its used entry (`GuestRam`).
            buf.copy_from_slice(unsafe { self.ram.slot(self.disk, r.slot) });
            Request::write(&self.file, offset, buf, token)
        } else {
            Request::read(&self.file, offset, buf, token)
        }
    }

    /// A request's completion: the slot's memory back (with `--bounce`, a read's data copied
    /// into guest RAM), then the used ring and the interrupt.
    fn complete(self: &Rc<Self>, slot: u32, write: bool, c: Completion) {
        let result = match &c.result {
            Ok(n) => *n as i64,
            Err(e) => -(e.raw_os_error().unwrap_or(libc::EIO) as i64),
        };
        let copy_in = if write { 0 } else { result.max(0) as usize };
        self.take_back(slot, copy_in, c.buf);
        match &self.irq_batch {
            None => self.vq.push_used(UsedEntry { slot, result }),
            Some(batch) => {
                self.vq.push_used_quietly(UsedEntry { slot, result });
                batch.hold(self);
            }
        }
    }

    /// Takes a request's memory back: guest iovecs are dropped (the engine is done with the
    /// slot), a bounce buffer goes home after its first `copy_in` bytes are copied into the
    /// slot's guest RAM.
    fn take_back(&self, slot: u32, copy_in: usize, bufs: IoBuffers) {
        if let IoBuffers::One(buf) = bufs {
            if copy_in > 0 {
                // SAFETY: the slot is the iothread's until its used entry (`GuestRam`).
                let mem = unsafe { self.ram.slot_mut(self.disk, slot) };
                let n = copy_in.min(buf.len());
                mem[..n].copy_from_slice(&buf[..n]);
            }
            self.bounce.borrow_mut()[slot as usize] = Some(buf);
        }
    }
}

/// Interrupts held back until the end of a batch of completions (`--batch-interrupts`): the
/// first completion of a queue in a batch lists the queue and defers one call
/// ([`AioContext::deferred_call`], QEMU's `defer_call()`), which raises each listed queue's
/// interrupt once, after the engine has delivered the batch and sent the requests its
/// callbacks queued. QEMU defers `virtio_notify_irqfd()` the same way; without it, each
/// completion is an eventfd write, and the first one wakes the guest before the rest of the
/// batch is there.
struct IrqBatch {
    pending: RefCell<Vec<Rc<HostQueue>>>,
    raise: DeferredCall,
}

impl IrqBatch {
    /// A batch whose deferred call belongs to `ctx`.
    fn new<L: EventLoop + 'static>(ctx: &AioContext<L>) -> Rc<IrqBatch> {
        Rc::new_cyclic(|me: &std::rc::Weak<IrqBatch>| {
            let me = me.clone();
            IrqBatch {
                pending: RefCell::new(Vec::new()),
                raise: ctx.deferred_call(move || {
                    if let Some(batch) = me.upgrade() {
                        batch.raise_held();
                    }
                }),
            }
        })
    }

    /// Holds `queue`'s interrupt until the batch ends (once per queue and batch).
    fn hold(&self, queue: &Rc<HostQueue>) {
        if !queue.irq_pending.replace(true) {
            self.pending.borrow_mut().push(queue.clone());
            self.raise.call();
        }
    }

    /// Raises every held interrupt.
    fn raise_held(&self) {
        let held = std::mem::take(&mut *self.pending.borrow_mut());
        for queue in held {
            queue.irq_pending.set(false);
            queue.vq.raise_interrupt();
        }
    }
}

/// What one iothread serves: its engine, attached to its context, and the virtqueues whose
/// doorbells are registered there. The context owns the engine (and the handlers their
/// queues): the guest RAM the requests point into must outlive the context.
pub(super) struct Station<L: EventLoop + 'static, E: IoEngine + 'static> {
    _engine: Rc<AttachedEngine<L, E>>,
    queues: Vec<Arc<Virtqueue>>,
    irq_batch: Option<Rc<IrqBatch>>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Station<L, E> {
    /// Sets `ctx` up for the cell: its polling (`spec.poll_max_ns`, `spec.poll_idle`),
    /// `engine` attached, a doorbell handler for each queue of `places`, its requests pointing
    /// into `ram`, and with `spec.batch_interrupts` the deferred call that raises the interrupts
    /// of a batch.
    pub(super) fn set_up(
        ctx: &AioContext<L>,
        engine: E,
        spec: &CellSpec,
        ram: &Arc<GuestRam>,
        places: Vec<QueuePlace>,
    ) -> io::Result<Self> {
        ctx.set_poll_params(spec.poll_max_ns.params());
        ctx.set_poll_idle_interval(spec.poll_idle);
        // Every request is submitted with its own completion (`HostQueue::complete`).
        let engine = Rc::new(ctx.attach_engine(engine, |_, _| {})?);
        let mut queues = Vec::with_capacity(places.len());
        let irq_batch = spec.batch_interrupts.then(|| IrqBatch::new(ctx));
        for place in places {
            queues.push(place.vq.clone());
            register_doorbell(ctx, &engine, spec, ram, place, irq_batch.clone())?;
        }
        Ok(Station {
            _engine: engine,
            queues,
            irq_batch,
        })
    }

    /// How many virtqueues this iothread serves.
    pub(super) fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Deregisters every doorbell and raises any interrupt still held (the guests are done).
    pub(super) fn tear_down(&self, ctx: &AioContext<L>) {
        for vq in &self.queues {
            let _ = ctx.remove_fd_handler(&vq.doorbell);
        }
        if let Some(batch) = &self.irq_batch {
            batch.raise_held();
        }
    }
}

/// Registers the doorbell of `place`: `io_read` and `io_poll_ready` take its requests into
/// the engine, `io_poll` looks at its available ring.
fn register_doorbell<L: EventLoop + 'static, E: IoEngine + 'static>(
    ctx: &AioContext<L>,
    engine: &Rc<AttachedEngine<L, E>>,
    spec: &CellSpec,
    ram: &Arc<GuestRam>,
    place: QueuePlace,
    irq_batch: Option<Rc<IrqBatch>>,
) -> io::Result<()> {
    let bounce = (0..spec.iodepth)
        .filter(|_| place.driven && spec.memory == MemoryPath::Bounce)
        .map(|_| Some(AlignedBuf::new(spec.bs)))
        .collect();
    let vq = place.vq;
    let host = Rc::new(HostQueue {
        disk: place.disk,
        vq: vq.clone(),
        file: place.file,
        base: place.base,
        ram: ram.clone(),
        memory: spec.memory,
        bounce: RefCell::new(bounce),
        irq_batch,
        irq_pending: Cell::new(false),
    });
    let engine = engine.clone();
    let process = Rc::new(move || host.process(&engine));
    let (p1, p2, vq2, vq3) = (process.clone(), process, vq.clone(), vq.clone());
    let (vq4, vq5) = (vq.clone(), vq.clone());
    ctx.set_fd_handler(
        &vq.doorbell,
        FdHandler::new()
            .on_read(move |_| {
                vq2.doorbell.test_and_clear();
                p1();
            })
            .on_poll(move || vq3.avail_len.load(Ordering::Acquire) > 0)
            .on_poll_ready(move |_| p2())
            // While the iothread polls, the guest need not kick (QEMU's virtio-blk turns the
            // queue's notifications off in io_poll_begin and on in io_poll_end, after which
            // the loop checks the queue once more).
            .on_poll_begin(move || vq4.no_notify.store(true, Ordering::Relaxed))
            .on_poll_end(move || {
                vq5.no_notify.store(false, Ordering::Relaxed);
                std::sync::atomic::fence(Ordering::SeqCst);
            }),
    )
    .map_err(io::Error::from)
}
