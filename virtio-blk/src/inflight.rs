//! The requests a queue has taken and not yet completed, recorded for a device that restarts.
//!
//! This module owns the contract between a queue and its in-flight log, never the log's
//! storage: vhost-user keeps it in a shared region the frontend hands to the next backend
//! (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`, in `aio-vhost-user-blk`); a VMM that serves the
//! device in its own process has no use for one.
//!
//! A queue with a log calls it, for every chain it takes, in this order:
//!
//! * [`InflightLog::taken`] once the head is popped from the avail ring (or resubmitted), before
//!   its request is submitted to the disk;
//! * [`InflightLog::completing`] just before the head's used element is published (the used
//!   index moves): the head is the last batch's, in the region's terms;
//! * [`InflightLog::completed`] once the used index includes it, with that index.
//!
//! So a process that dies at any point leaves a log from which a new one knows which heads
//! were taken and not returned to the driver: every head marked and not completed, plus at
//! most the last batch's head if the used index moved past it. A queue started with
//! [`Inflight::resubmit`] runs those heads first, in the order given (oldest first), before it
//! takes anything from the avail ring; its next avail index must already count them (the
//! recovery, which reads the log, sets it). A resubmitted request runs a second time: reads,
//! writes of the same data, flush, discard and write-zeroes are all safe to repeat.

/// Where a queue records its requests in flight (see the module's contract).
///
/// `Send`: a transport builds it on its control thread and hands it to the iothread that
/// serves the queue.
pub trait InflightLog: Send {
    /// `head` was taken; its request is about to be submitted.
    fn taken(&mut self, head: u16);
    /// `head`'s used element is about to be published.
    fn completing(&mut self, head: u16);
    /// `head`'s used element is published; the used index is now `used_idx`.
    fn completed(&mut self, head: u16, used_idx: u16);
}

/// A queue's in-flight log and what a recovery found in it, for
/// [`QueueSetup::inflight`](crate::queue::QueueSetup::inflight).
pub struct Inflight {
    /// Where the queue records its requests from now on.
    pub log: Box<dyn InflightLog>,
    /// Heads taken by an earlier device and never completed, oldest first: run again before
    /// anything new.
    pub resubmit: Vec<u16>,
}

impl std::fmt::Debug for Inflight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflight")
            .field("resubmit", &self.resubmit)
            .finish_non_exhaustive()
    }
}
