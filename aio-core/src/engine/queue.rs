//! The plug/batch queue every engine puts in front of its kernel interface.
//!
//! This module owns queued requests (accepted, not yet sent), the plug depth and the batch
//! size. Engines decide how many requests fit (`free` slots); this queue decides which go.

use std::collections::VecDeque;

use super::request::{Completion, Request};
use super::DEFAULT_MAX_BATCH;

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

    /// Puts a request back at the head (it could not be sent after all, e.g. `EAGAIN`).
    pub fn push_front(&mut self, request: Request) {
        self.queue.push_front(request);
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

    /// The batch size.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Queued requests.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many requests may go out now (before the free-slot limit): while plugged, a full
    /// batch once `max_batch` are queued (QEMU's rule: a plug never holds more than a batch),
    /// else nothing; unplugged, up to `max_batch`.
    pub fn sendable(&self) -> usize {
        if self.is_plugged() && self.queue.len() < self.max_batch {
            0
        } else {
            self.max_batch.min(self.queue.len())
        }
    }

    /// The next batch to send when `free` slots are available: up to
    /// `min(free, sendable())` requests from the head.
    pub fn next_batch(&mut self, free: usize) -> std::collections::vec_deque::Drain<'_, Request> {
        let n = free.min(self.sendable());
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
    fn a_plug_holds_less_than_a_batch_and_releases_a_full_one() {
        let file = IoFile::from(std::fs::File::open("/dev/null").unwrap());
        let mut q = SubmitQueue::new();
        q.set_max_batch(4);
        q.plug();
        for t in 0..3 {
            q.push(Request::read(&file, 0, AlignedBuf::new(512), t));
        }
        assert_eq!(q.next_batch(usize::MAX).count(), 0, "3 < max_batch: held");
        q.push(Request::read(&file, 0, AlignedBuf::new(512), 3));
        q.push(Request::read(&file, 0, AlignedBuf::new(512), 4));
        assert_eq!(q.sendable(), 4);
        assert_eq!(q.next_batch(2).count(), 2, "never more than the free slots");
        assert_eq!(q.next_batch(usize::MAX).count(), 0, "3 left: held again");
        assert!(q.unplug());
        assert_eq!(
            q.next_batch(usize::MAX).count(),
            3,
            "unplugged: the rest goes"
        );
    }
}
