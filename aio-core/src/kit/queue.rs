//! The plug/batch queue every engine puts in front of its kernel interface.
//!
//! This module owns queued requests (accepted, not yet sent), the plug depth and the batch
//! size. Engines decide how many requests fit (`free` slots) and say how many the kernel (or
//! the workers) already hold; this queue decides which go.
//!
//! # The batch rule
//!
//! A batch is at most `max_batch` requests, and never larger than the work the kernel already
//! has (`in_kernel`, at least 1). A submission call hands its requests to the device only when
//! it returns (the block layer plugs them for the call), so a batch sent to an idle device
//! keeps that device idle for as long as the kernel takes to accept the whole batch. With the
//! rule, an idle device gets the first request at once and batches grow 1, 1, 2, 4, ... up to
//! `max_batch` while the device works; a busy device gets full batches. While plugged, the
//! queue holds requests until a batch of that size is queued (QEMU's rule, a plug never holds
//! a full batch back, with the batch sized by the device's work), and `unplug` sends the rest.
//!
//! Measured on this project's virtio disk (BENCHMARKS.md, "The batch rule"): QD32 4k random
//! reads refilled from their completions in fixed batches of 32 ran at 0.77-0.82 of fio's
//! IOPS (fio submits one request per call), because each batch went out while the device was
//! idle and the batch came back together, round after round. With the rule: 0.96-1.01, at
//! about 11 requests per submission call.

use std::collections::VecDeque;

use crate::engine::{Completion, Request, DEFAULT_MAX_BATCH};

/// How much of its queue an engine sends now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// What the plug and [the batch rule](self#the-batch-rule) release.
    ByBatchRule,
    /// Everything, in whole batches (`drain`, drop).
    All,
}

/// Requests accepted by an engine but not yet handed to the kernel or a worker.
#[derive(Debug)]
pub struct SubmitQueue {
    queue: VecDeque<Request>,
    plug_depth: u32,
    max_batch: usize,
}

impl Default for SubmitQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl SubmitQueue {
    /// An empty, unplugged queue with the default batch size.
    pub fn new() -> Self {
        SubmitQueue {
            queue: VecDeque::new(),
            plug_depth: 0,
            max_batch: DEFAULT_MAX_BATCH,
        }
    }

    /// Queues a request.
    pub fn push(&mut self, request: Request) {
        self.queue.push_back(request);
    }

    /// The request that goes next, if any.
    pub fn front(&self) -> Option<&Request> {
        self.queue.front()
    }

    /// Starts or nests a batch.
    pub fn plug(&mut self) {
        self.plug_depth += 1;
    }

    /// Ends a batch; true when the outermost one ended (time to send).
    pub fn unplug(&mut self) -> bool {
        self.plug_depth = self.plug_depth.saturating_sub(1);
        self.plug_depth == 0
    }

    /// Whether a batch is open.
    pub fn is_plugged(&self) -> bool {
        self.plug_depth > 0
    }

    /// Sets the batch size (at least 1).
    pub fn set_max_batch(&mut self, max: usize) {
        self.max_batch = max.max(1);
    }

    /// Queued requests.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The largest batch that may go out while the kernel holds `in_kernel` requests:
    /// `max_batch`, but no more than `in_kernel`, and at least 1 (see the
    /// [batch rule](self#the-batch-rule)).
    pub fn batch_limit(&self, in_kernel: usize) -> usize {
        in_kernel.clamp(1, self.max_batch)
    }

    /// The size of one round of an engine's submit loop: [`SubmitQueue::batch_limit`] for
    /// [`Flush::ByBatchRule`], a whole `max_batch` for [`Flush::All`] (`drain`, drop), where
    /// holding back buys nothing.
    pub fn round_limit(&self, in_kernel: usize, flush: Flush) -> usize {
        match flush {
            Flush::All => self.max_batch,
            Flush::ByBatchRule => self.batch_limit(in_kernel),
        }
    }

    /// How many requests may go out now (before the free-slot limit), the kernel holding
    /// `in_kernel`: while plugged, a whole batch ([`SubmitQueue::batch_limit`]) once that many
    /// are queued, else nothing; unplugged, up to a batch.
    pub fn sendable(&self, in_kernel: usize) -> usize {
        let limit = self.batch_limit(in_kernel);
        if self.is_plugged() && self.queue.len() < limit {
            0
        } else {
            limit.min(self.queue.len())
        }
    }

    /// The next batch to send when `free` slots are available and the kernel holds
    /// `in_kernel` requests: up to `min(free, sendable(in_kernel))` requests from the head.
    pub fn next_batch(
        &mut self,
        free: usize,
        in_kernel: usize,
    ) -> std::collections::vec_deque::Drain<'_, Request> {
        let n = free.min(self.sendable(in_kernel));
        self.queue.drain(..n)
    }

    /// Like [`SubmitQueue::next_batch`] but ignoring the plug (for `drain`).
    pub fn force_batch(&mut self, free: usize) -> std::collections::vec_deque::Drain<'_, Request> {
        let n = free.min(self.max_batch).min(self.queue.len());
        self.queue.drain(..n)
    }

    /// Removes a queued request by token and completes it with `ECANCELED`.
    pub fn cancel(&mut self, token: u64) -> Option<Completion> {
        let pos = self.queue.iter().position(|r| r.token == token)?;
        let req = self.queue.remove(pos)?;
        Some(req.complete(Err(std::io::Error::from_raw_os_error(libc::ECANCELED))))
    }

    /// Cancels everything queued (shutdown).
    pub fn cancel_all(&mut self) -> Vec<Completion> {
        self.queue
            .drain(..)
            .map(|r| r.complete(Err(std::io::Error::from_raw_os_error(libc::ECANCELED))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{AlignedBuf, IoFile};

    #[test]
    fn empty_until_a_request_is_queued_and_again_once_it_goes() {
        let mut q = queue_of(0, 4);
        assert!(q.is_empty());
        q = queue_of(1, 4);
        assert!(!q.is_empty());
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_batch(4, 1).count(), 1);
        assert!(q.is_empty());
    }

    #[test]
    fn cancel_all_hands_back_every_queued_request_as_ecanceled() {
        let mut q = queue_of(3, 4);
        let cancelled = q.cancel_all();
        let tokens: Vec<u64> = cancelled.iter().map(|c| c.token).collect();
        assert_eq!(tokens, [0, 1, 2], "each once, in order");
        assert!(cancelled.iter().all(|c| c.errno() == Some(libc::ECANCELED)));
        assert!(q.is_empty());
    }

    fn queue_of(n: u64, max_batch: usize) -> SubmitQueue {
        let file = IoFile::from(std::fs::File::open("/dev/null").unwrap());
        let mut q = SubmitQueue::new();
        q.set_max_batch(max_batch);
        for t in 0..n {
            q.push(Request::read(&file, 0, AlignedBuf::new(512), t));
        }
        q
    }

    #[test]
    fn nested_plugs_hold_until_the_outer_unplug() {
        const BUSY: usize = 1000;
        let mut q = queue_of(0, 8);
        q.plug();
        q.plug();
        let file = IoFile::from(std::fs::File::open("/dev/null").unwrap());
        for t in 0..3 {
            q.push(Request::read(&file, 0, AlignedBuf::new(512), t));
        }
        assert!(!q.unplug(), "the inner unplug ends no batch");
        assert!(q.is_plugged());
        assert_eq!(q.sendable(BUSY), 0, "still held by the outer plug");
        assert!(q.unplug(), "the outer unplug ends the batch");
        assert_eq!(q.sendable(BUSY), 3);
        // An unmatched unplug leaves no debt: the next plug holds again.
        q.unplug();
        assert!(!q.is_plugged());
        q.plug();
        assert!(q.is_plugged());
    }

    #[test]
    fn a_plug_on_a_busy_device_holds_less_than_a_batch_and_releases_a_full_one() {
        const BUSY: usize = 1000;
        let mut q = queue_of(0, 4);
        q.plug();
        let file = IoFile::from(std::fs::File::open("/dev/null").unwrap());
        for t in 0..3 {
            q.push(Request::read(&file, 0, AlignedBuf::new(512), t));
        }
        assert_eq!(
            q.next_batch(usize::MAX, BUSY).count(),
            0,
            "3 < max_batch: held"
        );
        q.push(Request::read(&file, 0, AlignedBuf::new(512), 3));
        q.push(Request::read(&file, 0, AlignedBuf::new(512), 4));
        assert_eq!(q.sendable(BUSY), 4);
        assert_eq!(
            q.next_batch(2, BUSY).count(),
            2,
            "never more than the free slots"
        );
        assert_eq!(
            q.next_batch(usize::MAX, BUSY).count(),
            0,
            "3 left: held again"
        );
        assert!(q.unplug());
        assert_eq!(
            q.next_batch(usize::MAX, BUSY).count(),
            3,
            "unplugged: the rest goes"
        );
    }

    #[test]
    fn batches_to_an_idle_device_grow_from_one() {
        // Unplugged, 32 queued, nothing in the kernel: 1, 1, 2, 4, 8, 16.
        let mut q = queue_of(32, 32);
        let mut in_kernel = 0;
        let mut sizes = Vec::new();
        loop {
            let n = q.next_batch(usize::MAX, in_kernel).count();
            if n == 0 {
                break;
            }
            sizes.push(n);
            in_kernel += n;
        }
        assert_eq!(sizes, [1, 1, 2, 4, 8, 16]);
        // Plugged, requests arriving one by one: the same growth, and a remainder smaller
        // than the kernel's work is held until unplug.
        let mut q = queue_of(0, 32);
        let file = IoFile::from(std::fs::File::open("/dev/null").unwrap());
        q.plug();
        let mut in_kernel = 0;
        let mut sizes = Vec::new();
        for t in 0..10 {
            q.push(Request::read(&file, 0, AlignedBuf::new(512), t));
            let n = q.next_batch(usize::MAX, in_kernel).count();
            if n > 0 {
                sizes.push(n);
                in_kernel += n;
            }
        }
        assert_eq!(sizes, [1, 1, 2, 4], "8 sent, 2 held");
        assert_eq!(q.len(), 2);
        assert!(q.unplug());
        assert_eq!(q.next_batch(usize::MAX, in_kernel).count(), 2);
    }
}
