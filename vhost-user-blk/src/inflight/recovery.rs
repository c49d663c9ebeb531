//! A queue's start on an in-flight region: the last batch repaired, the heads still in
//! flight found and ordered, the ring's indices derived from them.
//!
//! This module owns the rules a restarted backend follows before it serves a queue
//! (libvhost-user's `vu_check_queue_inflights`, with the checks a region that is input
//! needs):
//!
//! * **A fresh queue** (`version` 0: the frontend's zeroed region, or one never started) is
//!   set up (every entry cleared, `desc_num` set, `used_idx` the used ring's, version 1) and
//!   starts at the frontend's vring base: nothing to recover. A ring larger than the region's
//!   entries refuses the queue.
//! * **The last batch is repaired.** When the backend died after publishing used elements and
//!   before clearing their entries, the region's `used_idx` lags the used ring's index: the
//!   heads in the used ring between the two are cleared and `used_idx` catches up. (With
//!   batches of one, as this backend writes them, that is `last_batch_head`; reading the used
//!   ring also repairs a region left by a backend that batched.) A lag larger than the ring
//!   refuses the queue while heads are marked; with none marked the ring was set up anew, and
//!   the region follows it.
//! * **Every head still marked is resubmitted**, oldest counter first (a tie: the lower head
//!   first), and the next taken head's counter follows the largest. An entry that is not 0 or
//!   1, or a head beyond the ring, is cleared and counted as ignored.
//! * **The indices follow**: next used = the used ring's index; next avail = used index + the
//!   heads in flight (each head taken is either in the used ring or in flight). More heads in
//!   flight than the driver made available past the used index refuses the queue.

use std::sync::atomic::Ordering;

use super::error::InflightError;
use super::layout::{Entry, VERSION};
use super::region::{QueueRegion, RegionLog};

/// What the ring says when its queue starts, read from guest memory (and the frontend's
/// vring base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingState {
    /// The ring's size (heads are below it).
    pub size: u16,
    /// `VHOST_USER_SET_VRING_BASE`'s next avail index (used for a fresh queue only).
    pub base: u16,
    /// The avail ring's index.
    pub avail_idx: u16,
    /// The used ring's index.
    pub used_idx: u16,
}

/// A queue recovered from its region: where the ring resumes, what to run again, and the
/// log to keep.
#[derive(Debug)]
pub struct Recovered {
    /// The ring's next avail index.
    pub next_avail: u16,
    /// The ring's next used index.
    pub next_used: u16,
    /// Heads taken by the previous backend and never completed, oldest first.
    pub resubmit: Vec<u16>,
    /// Used elements whose entries were cleared (a torn last batch).
    pub repaired: u16,
    /// Entries ignored and cleared (a value not 0 or 1, a head beyond the ring).
    pub ignored: usize,
    /// The log the queue writes from now on.
    pub log: RegionLog,
}

impl QueueRegion {
    /// Recovers the queue for a ring in state `ring`; `used_head(i)` reads the head of the
    /// used ring's element at index `i` (wrapping; `None` when it cannot be read).
    pub fn recover(
        self,
        ring: &RingState,
        used_head: impl Fn(u16) -> Option<u16>,
    ) -> Result<Recovered, InflightError> {
        let queue = self.index;
        let room = self.region.queue_size;
        // 1. A fresh queue has nothing to recover; a version not ours is refused.
        let version = self.header().version.load(Ordering::Acquire);
        if version == 0 {
            return self.start_fresh(ring);
        }
        if version != VERSION {
            return Err(InflightError::Version { queue, version });
        }
        // 2. The entries must cover the ring and fit the stride.
        let desc_num = self.header().desc_num.load(Ordering::Acquire);
        if desc_num > room || desc_num < ring.size {
            return Err(InflightError::DescNum {
                queue,
                desc_num,
                ring_size: ring.size,
                room,
            });
        }
        let entries = &self.entries()[..usize::from(desc_num)];
        // 3. The last batch repaired, 4. the heads still marked found, oldest first.
        let repaired = self.repair_last_batch(entries, ring, used_head)?;
        let (mut marked, ignored) = marked_heads(entries, ring.size);
        let available = ring.avail_idx.wrapping_sub(ring.used_idx);
        if marked.len() > usize::from(available) {
            return Err(InflightError::TooManyInFlight {
                queue,
                marked: marked.len(),
                available,
            });
        }
        marked.sort_unstable();
        // 5. The ring resumes after them; the next head taken is younger than all of them.
        let next_counter = marked.last().map_or(0, |&(c, _)| c.wrapping_add(1));
        let resubmit: Vec<u16> = marked.into_iter().map(|(_, head)| head).collect();
        let next_avail = ring.used_idx.wrapping_add(resubmit.len() as u16);
        self.recovered(
            next_avail,
            ring.used_idx,
            resubmit,
            repaired,
            ignored,
            next_counter,
        )
    }

    /// Sets up a queue never started (entries cleared, `desc_num`, `used_idx`, version 1);
    /// it starts at the vring base.
    fn start_fresh(self, ring: &RingState) -> Result<Recovered, InflightError> {
        let room = self.region.queue_size;
        if ring.size > room {
            return Err(InflightError::DescNum {
                queue: self.index,
                desc_num: room,
                ring_size: ring.size,
                room,
            });
        }
        for entry in self.entries() {
            entry.inflight.store(0, Ordering::Relaxed);
            entry.counter.store(0, Ordering::Relaxed);
        }
        let header = self.header();
        header.features.store(0, Ordering::Relaxed);
        header.desc_num.store(room, Ordering::Relaxed);
        header.last_batch_head.store(0, Ordering::Relaxed);
        header.used_idx.store(ring.used_idx, Ordering::Relaxed);
        header.version.store(VERSION, Ordering::Release);
        self.recovered(ring.base, ring.base, Vec::new(), 0, 0, 0)
    }

    /// Clears the entries of the used elements published after the region's `used_idx` (a
    /// torn last batch) and brings `used_idx` to the ring's; gives how many were cleared.
    fn repair_last_batch(
        &self,
        entries: &[Entry],
        ring: &RingState,
        used_head: impl Fn(u16) -> Option<u16>,
    ) -> Result<u16, InflightError> {
        let header = self.header();
        let region_used = header.used_idx.load(Ordering::Acquire);
        let lag = ring.used_idx.wrapping_sub(region_used);
        let any_marked = || {
            entries
                .iter()
                .any(|e| e.inflight.load(Ordering::Acquire) != 0)
        };
        if lag > ring.size && any_marked() {
            return Err(InflightError::UsedIndex {
                queue: self.index,
                region: region_used,
                ring: ring.used_idx,
            });
        }
        // (A lag larger than the ring with nothing marked: a ring set up anew, e.g. after a
        // reset the frontend did not tell the region about; nothing to repair.)
        let repaired = if lag > ring.size { 0 } else { lag };
        for i in 0..repaired {
            let head = used_head(region_used.wrapping_add(i));
            if let Some(entry) = head.and_then(|h| entries.get(usize::from(h))) {
                entry.inflight.store(0, Ordering::Release);
            }
        }
        header.used_idx.store(ring.used_idx, Ordering::Release);
        Ok(repaired)
    }

    fn recovered(
        self,
        next_avail: u16,
        next_used: u16,
        resubmit: Vec<u16>,
        repaired: u16,
        ignored: usize,
        counter: u64,
    ) -> Result<Recovered, InflightError> {
        let desc_num = usize::from(self.header().desc_num.load(Ordering::Acquire));
        Ok(Recovered {
            next_avail,
            next_used,
            resubmit,
            repaired,
            ignored,
            log: RegionLog {
                queue: self,
                counter,
                desc_num,
            },
        })
    }
}

/// The heads marked in flight below `ring_size`, as (counter, head); an entry not 0 or 1, or
/// a head beyond the ring, is cleared and counted as ignored.
fn marked_heads(entries: &[Entry], ring_size: u16) -> (Vec<(u64, u16)>, usize) {
    let mut marked = Vec::new();
    let mut ignored = 0;
    for (head, entry) in entries.iter().enumerate() {
        match entry.inflight.load(Ordering::Acquire) {
            0 => {}
            1 if head < usize::from(ring_size) => {
                marked.push((entry.counter.load(Ordering::Acquire), head as u16));
            }
            _ => {
                entry.inflight.store(0, Ordering::Release);
                ignored += 1;
            }
        }
    }
    (marked, ignored)
}
