//! What an iothread serving virtio-blk queues holds: its engine and its queues.
//!
//! This module owns the per-iothread state and the operations the transport sends to it
//! (start, stop, new memory, new call fd, new dirty logging), each run on the iothread itself; it never speaks
//! the transport's protocol.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;

use crate::dirty::DirtyTracking;
pub use crate::queue::QueueSetup;
use crate::queue::{GuestMemory, QueueError, QueueStats, VirtioBlkQueue};

/// Which queue: a disk's number in the daemon and the queue's index on it.
pub type QueueKey = (u32, u16);

/// One iothread's state: an engine (`E`) attached to its context, and the queues it serves.
pub struct DataPlane<L: EventLoop + 'static, E: IoEngine + 'static> {
    engine: AttachedEngine<L, E>,
    queues: RefCell<HashMap<QueueKey, VirtioBlkQueue<L, E>>>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> DataPlane<L, E> {
    /// Attaches `engine` to `ctx` (every request carries its own completion callback).
    pub fn new(ctx: &AioContext<L>, engine: E) -> Result<Self, aio_core::AioError> {
        let engine = ctx.attach_engine(engine, |_, _| {})?;
        Ok(DataPlane {
            engine,
            queues: RefCell::new(HashMap::new()),
        })
    }

    /// Starts serving a queue (a queue already running under `key` is stopped first).
    pub fn start(
        &self,
        ctx: &AioContext<L>,
        key: QueueKey,
        setup: QueueSetup,
    ) -> Result<(), QueueError> {
        self.stop(ctx, key);
        let q = VirtioBlkQueue::start_with(ctx, self.engine.clone(), setup)?;
        self.queues.borrow_mut().insert(key, q);
        Ok(())
    }

    /// Stops a queue once its requests have completed; its next avail index, if it ran.
    pub fn stop(&self, ctx: &AioContext<L>, key: QueueKey) -> Option<u16> {
        let q = self.queues.borrow_mut().remove(&key)?;
        Some(q.stop(ctx))
    }

    /// Gives a disk's running queues a new memory table.
    pub fn set_memory(&self, disk: u32, memory: &GuestMemory) {
        for (key, q) in self.queues.borrow().iter() {
            if key.0 == disk {
                q.set_memory(memory.clone());
            }
        }
    }

    /// Gives a running queue a new call eventfd.
    pub fn set_call(&self, key: QueueKey, call: Option<File>) {
        if let Some(q) = self.queues.borrow().get(&key) {
            q.set_call(call);
        }
    }

    /// Gives a running queue new dirty logging (none: it reports nothing from now on); when
    /// this returns, nothing reports to the queue's previous log.
    pub fn set_dirty_tracking(&self, key: QueueKey, dirty: Option<DirtyTracking>) {
        if let Some(q) = self.queues.borrow().get(&key) {
            q.set_dirty_tracking(dirty);
        }
    }

    /// A running queue's statistics.
    pub fn stats(&self, key: QueueKey) -> Option<QueueStats> {
        self.queues.borrow().get(&key).map(|q| q.stats())
    }

    /// The iothread's engine, for other exports' requests on this iothread (an NBD
    /// connection's image queue).
    pub fn engine(&self) -> &AttachedEngine<L, E> {
        &self.engine
    }

    /// Requests in flight on the engine.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
}

/// The iothread (of `iothreads`) that serves queue `queue` of a disk whose queue 0 is number
/// `first_queue` when the queues of every disk are numbered in order (disk 0's, then disk
/// 1's, ...): queue number `first_queue + queue` runs on iothread
/// `(first_queue + queue) % iothreads`. This is QEMU's iothread-vq-mapping round robin
/// continued across disks, so that one-queue disks spread over the iothreads instead of all
/// landing on the first; with `Q` queues on every disk, queue `q` of disk `d` is on
/// `(d * Q + q) % iothreads`.
///
/// ```
/// use aio_virtio_blk::dataplane::iothread_of;
/// // Four one-queue disks on four iothreads: one each.
/// let on: Vec<usize> = (0..4).map(|d| iothread_of(d, 0, 4)).collect();
/// assert_eq!(on, [0, 1, 2, 3]);
/// ```
pub fn iothread_of(first_queue: usize, queue: usize, iothreads: usize) -> usize {
    (first_queue + queue) % iothreads.max(1)
}
