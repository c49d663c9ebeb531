//! What the device writes into guest memory, reported to a dirty log: how a transport that
//! migrates a running guest (vhost-user's `VHOST_F_LOG_ALL`) learns which pages to copy again.
//!
//! This module owns the contract between a queue and a dirty log ([`DirtyLogger`]) and the
//! list of writes a queue reports; never the log's storage (vhost-user's shared bitmap is
//! `aio-vhost-user-blk`'s) nor when logging is on (the transport decides, and hands a queue a
//! [`DirtyTracking`] or none: [`QueueSetup::with_dirty_tracking`],
//! [`VirtioBlkQueue::set_dirty_tracking`]).
//!
//! A queue with a tracking reports every byte of guest memory the device writes, by its
//! guest-physical address, each report after the write it reports:
//!
//! * the data descriptors of a read, all of them whatever its status (a failed read may
//!   have written part of them), and the bytes of `GET_ID`'s serial, once the request is
//!   done and before its status byte is written;
//! * the status byte, once written, before the used element is published;
//! * with [`DirtyTracking::used_ring`] (the ring's writes are logged): the used element and
//!   the used index, as soon as the element is published (the index can be reported only
//!   after it moved); the used ring's `flags`, or with `EVENT_IDX` its `avail_event`, each
//!   time the device turns the driver's notifications off or on.
//!
//! Every report is made on the queue's thread, in the completion that writes, so a queue
//! whose [`VirtioBlkQueue::stop`] returned has reported everything it wrote (stop waits for
//! every request). The tracking is read at each report, not when a request starts: a
//! tracking replaced while requests are in flight (a new log, logging turned off) gets their
//! later reports, and once [`VirtioBlkQueue::set_dirty_tracking`] returned nothing reports to
//! the old one. Without a tracking, a report costs the check of an `Option`.
//!
//! [`QueueSetup::with_dirty_tracking`]: crate::queue::QueueSetup::with_dirty_tracking
//! [`VirtioBlkQueue::set_dirty_tracking`]: crate::queue::VirtioBlkQueue::set_dirty_tracking
//! [`VirtioBlkQueue::stop`]: crate::queue::VirtioBlkQueue::stop

use std::cell::RefCell;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};

use crate::chain::{BlkOp, BlkRequest};
use crate::spec;

/// Where a queue reports the guest memory the device wrote (see the module's contract).
///
/// `Send + Sync`: one log serves every queue of a device, each on its own iothread.
pub trait DirtyLogger: Send + Sync {
    /// The device wrote `len` bytes of guest memory at guest-physical address `addr` (`len`
    /// may be 0: nothing was written).
    fn mark(&self, addr: u64, len: u64);
}

/// A queue's dirty logging: the log, and whether (and where) its used ring's writes go into
/// it.
#[derive(Clone)]
#[non_exhaustive]
pub struct DirtyTracking {
    /// The log.
    pub logger: Arc<dyn DirtyLogger>,
    /// The address the used ring is logged at (vhost-user's `log_guest_addr`, normally the
    /// ring's guest-physical address), if its writes are logged; the used ring's writes are
    /// not reported without it.
    pub used_ring: Option<u64>,
}

impl std::fmt::Debug for DirtyTracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyTracking")
            .field("used_ring", &self.used_ring)
            .finish_non_exhaustive()
    }
}

/// The used ring's header (`flags`, `idx`) in bytes.
const USED_HEADER: u64 = 4;
/// One used element (`id`, `len`) in bytes.
const USED_ELEMENT: u64 = 8;

impl DirtyTracking {
    /// Reports to `logger`; the used ring's writes at `used_ring`, if given.
    pub fn new(logger: Arc<dyn DirtyLogger>, used_ring: Option<u64>) -> Self {
        DirtyTracking { logger, used_ring }
    }

    /// `request` is done: the data the device wrote into its chain (a read's data
    /// descriptors, `GET_ID`'s serial); nothing for the other requests.
    pub(crate) fn request_done(&self, request: &BlkRequest) {
        match &request.op {
            BlkOp::Read { segments, .. } => {
                for s in segments {
                    self.logger.mark(s.addr.0, u64::from(s.len));
                }
            }
            BlkOp::GetId { buf } => {
                let written = u64::from(buf.len).min(spec::ID_BYTES as u64);
                self.logger.mark(buf.addr.0, written);
            }
            _ => {}
        }
    }

    /// The status byte at `addr` was written.
    pub(crate) fn status(&self, addr: u64) {
        self.logger.mark(addr, 1);
    }

    /// The used element at position `slot` of a ring of `size` and the used index were
    /// written.
    pub(crate) fn used(&self, size: u16, slot: u16) {
        if let Some(used) = self.used_ring {
            let element = USED_HEADER + USED_ELEMENT * u64::from(slot % size.max(1));
            self.logger.mark(used.wrapping_add(element), USED_ELEMENT);
            self.logger.mark(used.wrapping_add(2), 2);
        }
    }

    /// The device turned the driver's notifications off or on in a ring of `size`: the
    /// used ring's `flags`, or with `event_idx` its `avail_event`, may have been written.
    pub(crate) fn notification(&self, size: u16, event_idx: bool) {
        if let Some(used) = self.used_ring {
            let at = if event_idx {
                USED_HEADER + USED_ELEMENT * u64::from(size)
            } else {
                0
            };
            self.logger.mark(used.wrapping_add(at), 2);
        }
    }
}

/// What a queue holds: its tracking, if any, replaceable on the queue's thread; each report
/// a check of the `Option` when there is none.
#[derive(Debug, Default)]
pub(crate) struct Reports(RefCell<Option<DirtyTracking>>);

impl Reports {
    pub(crate) fn new(tracking: Option<DirtyTracking>) -> Self {
        Reports(RefCell::new(tracking))
    }

    pub(crate) fn set(&self, tracking: Option<DirtyTracking>) {
        *self.0.borrow_mut() = tracking;
    }

    /// See [`DirtyTracking::request_done`].
    pub(crate) fn request_done(&self, request: &BlkRequest) {
        if let Some(t) = self.0.borrow().as_ref() {
            t.request_done(request);
        }
    }

    /// See [`DirtyTracking::status`].
    pub(crate) fn status(&self, addr: u64) {
        if let Some(t) = self.0.borrow().as_ref() {
            t.status(addr);
        }
    }

    /// The used element at position `slot` of `queue`, and its used index, were written.
    pub(crate) fn used(&self, queue: &Queue, slot: u16) {
        if let Some(t) = self.0.borrow().as_ref() {
            t.used(queue.size(), slot);
        }
    }

    /// `queue`'s notifications were turned off or on.
    pub(crate) fn notification(&self, queue: &Queue) {
        if let Some(t) = self.0.borrow().as_ref() {
            t.notification(queue.size(), queue.event_idx_enabled());
        }
    }
}

#[cfg(test)]
#[path = "dirty_tests.rs"]
mod tests;
