//! The submit round of a kernel-queue engine: which requests go to the kernel next, in what
//! order, written once for every engine that keeps an [`EngineCore`].
//!
//! This module owns the order of a round, never the kernel call that sends it (the engine's)
//! or the batch rule itself ([`SubmitQueue`](super::SubmitQueue)).
//!
//! A round, as both the Linux AIO and the io_uring engine send one:
//!
//! * its size is the queue's batch rule ([`SubmitQueue::round_limit`](super::SubmitQueue::round_limit):
//!   a whole `max_batch` with [`Flush::All`]), capped by the room the kernel has now;
//! * remainders of short transfers and `EAGAIN` retries go first
//!   ([`InFlightTable::pop_resubmit`](super::InFlightTable::pop_resubmit)), in their order;
//! * then fresh requests from the queue, if the batch rule lets them go at the round's start:
//!   decided once, so that taking them one by one does not drop a full batch below the plug's
//!   threshold half-way (how many is the round's limit, at most a batch, and what is queued).
//!   Each is moved into the in-flight table as it is taken.
//!
//! A slot the kernel did not take goes back with
//! [`InFlightTable::unsent`](super::InFlightTable::unsent) and leads the next round.

use super::inflight::EngineCore;
use super::queue::Flush;

/// One submit round, from [`EngineCore::begin_round`]; take its slots with
/// [`EngineCore::next_in_round`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitRound {
    /// The round's size by the batch rule, before the kernel's room: a round that sent fewer
    /// than this emptied what may go now.
    pub batch: usize,
    /// How many slots the round may take: `batch` capped by the kernel's room.
    pub limit: usize,
    taken: usize,
    /// Whether the batch rule let fresh requests go when the round began.
    fresh: bool,
}

impl SubmitRound {
    /// Slots taken so far.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Whether the round may still take a slot after the one just taken.
    pub fn has_room(&self) -> bool {
        self.taken < self.limit
    }

    /// Whether fresh requests may still join the round (a request the engine looks ahead to,
    /// such as a range op it links to the one just taken, goes in this round).
    pub fn takes_fresh(&self) -> bool {
        self.fresh
    }
}

impl EngineCore {
    /// Begins a round with the kernel holding `in_kernel` requests and room for `room` more.
    pub fn begin_round(&self, in_kernel: usize, room: usize, flush: Flush) -> SubmitRound {
        let batch = self.queue.round_limit(in_kernel, flush);
        let fresh = match flush {
            Flush::All => true,
            Flush::ByBatchRule => self.queue.sendable(in_kernel) > 0,
        };
        SubmitRound {
            batch,
            limit: batch.min(room),
            taken: 0,
            fresh,
        }
    }

    /// The next slot of `round`: a resubmission, else a fresh request moved into the
    /// in-flight table; `None` when the round is full or nothing more may go.
    pub fn next_in_round(&mut self, round: &mut SubmitRound) -> Option<u32> {
        if round.taken >= round.limit {
            return None;
        }
        let slot = match self.table.pop_resubmit() {
            Some(slot) => slot,
            None if !round.fresh => return None,
            None => {
                let request = self.queue.force_batch(1).next()?;
                self.table.insert(request)
            }
        };
        round.taken += 1;
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{AlignedBuf, IoFile, Request};
    use crate::kit::Outcome;

    fn core_with(fsyncs: u64, file: &IoFile) -> EngineCore {
        let mut core = EngineCore::new(4);
        for token in 0..fsyncs {
            core.accept(Request::fsync(file, token)).expect("accepted");
        }
        core
    }

    fn token_of(core: &EngineCore, slot: u32) -> u64 {
        (0..100)
            .find(|&t| core.table.slot_of_token(t) == Some(slot))
            .expect("a live slot")
    }

    #[test]
    fn resubmissions_go_first_then_fresh_requests_in_order() {
        let file = IoFile::new(std::fs::File::open("/dev/null").expect("/dev/null"));
        let mut core = core_with(0, &file);
        core.accept(Request::readv(&file, 0, vec![AlignedBuf::new(8)], 50))
            .expect("accepted");
        let mut round = core.begin_round(0, 64, Flush::ByBatchRule);
        let read = core.next_in_round(&mut round).expect("the read");
        assert_eq!(core.next_in_round(&mut round), None, "nothing else queued");
        // The kernel now holds 8: the batch rule lets rounds of 4 (max_batch) go.
        // Short: its remainder waits, and leads the next round before fresh requests.
        core.table.prepare(read);
        assert_eq!(core.table.on_result(read, 4), Outcome::Resubmit);
        for token in 0..3 {
            core.accept(Request::fsync(&file, token)).expect("accepted");
        }
        let mut round = core.begin_round(8, 64, Flush::ByBatchRule);
        let slots: Vec<u32> = std::iter::from_fn(|| core.next_in_round(&mut round)).collect();
        let order: Vec<u64> = slots.iter().map(|&slot| token_of(&core, slot)).collect();
        assert_eq!(order, [50, 0, 1, 2]);
        assert_eq!((round.taken(), round.has_room()), (4, false));
    }

    #[test]
    fn the_kernels_room_caps_a_round_but_not_its_batch() {
        let file = IoFile::new(std::fs::File::open("/dev/null").expect("/dev/null"));
        let mut core = core_with(8, &file);
        let mut round = core.begin_round(0, 2, Flush::All);
        assert_eq!((round.batch, round.limit), (4, 2));
        assert!(core.next_in_round(&mut round).is_some());
        assert!(round.has_room() && round.takes_fresh());
        assert!(core.next_in_round(&mut round).is_some());
        assert!(!round.has_room());
        assert_eq!(core.next_in_round(&mut round), None);
        assert_eq!(core.queue.len(), 6, "what did not fit stays queued");
    }

    #[test]
    fn a_plugged_queue_below_a_batch_sends_only_resubmissions() {
        let file = IoFile::new(std::fs::File::open("/dev/null").expect("/dev/null"));
        let mut core = core_with(2, &file);
        core.queue.plug();
        // Plugged, with 2 queued and rounds of 4 allowed: the plug holds them.
        let mut round = core.begin_round(8, 64, Flush::ByBatchRule);
        assert!(!round.takes_fresh());
        assert_eq!(core.next_in_round(&mut round), None);
        // A drain sends them anyway.
        let mut round = core.begin_round(0, 64, Flush::All);
        assert_eq!(
            std::iter::from_fn(|| core.next_in_round(&mut round)).count(),
            2
        );
    }
}
