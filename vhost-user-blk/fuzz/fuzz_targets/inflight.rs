//! The in-flight region's recovery, against a hostile or half-written region and against a
//! model of the queue.
//!
//! The first byte picks the mode:
//!
//! * **Any region** (even): the rest is the region's bytes (its geometry and the ring's
//!   indices from the first few) and the used ring's heads. The recovery may refuse the queue
//!   but never panic or touch memory outside the region; when it accepts, every head it
//!   resubmits is in the ring, none twice, no more than the driver made available, the indices
//!   follow from them, and recovering again at once gives the same answer.
//! * **The model** (odd): the rest is a sequence of operations on one queue (take a head,
//!   complete one, crash, crash halfway through a completion) run through the log a queue
//!   writes; after every crash the recovery must resubmit exactly the heads taken and not
//!   completed, in the order they were taken, and resume the ring where it was.

#![no_main]

use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use aio_vhost_user_blk::inflight::{InflightRegion, RingState};
use aio_virtio_blk::inflight::InflightLog;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        any_region(rest);
    } else {
        model(rest);
    }
});

/// A little-endian u16 at `at`, or 0.
fn u16_at(bytes: &[u8], at: usize) -> u16 {
    match bytes.get(at..at + 2) {
        Some(b) => u16::from_le_bytes([b[0], b[1]]),
        None => 0,
    }
}

fn any_region(input: &[u8]) {
    let Some((head, rest)) = input.split_first_chunk::<10>() else {
        return;
    };
    // Geometry: 1..=4 queues of 1..=64 entries; a ring of at most that many heads.
    let queues = u16::from(head[0] % 4) + 1;
    let queue_size = 1u16 << (head[1] % 7);
    let ring_size = 1u16 << (head[2] % 7);
    let queue = u16::from(head[3]) % (queues + 1); // one past the end, sometimes
    let (avail_idx, used_idx) = (u16_at(head, 4), u16_at(head, 6));
    let base = u16_at(head, 8);
    let Ok((size, file)) = InflightRegion::create(queues, queue_size) else {
        return;
    };
    let region_len = (size as usize).min(rest.len());
    file.write_all_at(&rest[..region_len], 0).unwrap();
    let used_ring = &rest[region_len..];
    let used_head = |i: u16| {
        let at = usize::from(i % ring_size) * 2;
        used_ring
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let region = Arc::new(InflightRegion::map(&file, 0, size, queues, queue_size).unwrap());
    let ring = RingState {
        size: ring_size,
        base,
        avail_idx,
        used_idx,
    };
    let Ok(q) = region.queue(queue) else {
        assert!(queue >= queues);
        return;
    };
    let Ok(first) = q.clone().recover(&ring, used_head) else {
        return;
    };
    let mut seen = vec![false; usize::from(ring_size)];
    for &h in &first.resubmit {
        assert!(h < ring_size, "head {h} beyond a ring of {ring_size}");
        assert!(!seen[usize::from(h)], "head {h} resubmitted twice");
        seen[usize::from(h)] = true;
    }
    let count = first.resubmit.len() as u16;
    if first.resubmit.is_empty() && first.next_avail == base {
        // A fresh queue: it starts at the vring base.
        assert_eq!(first.next_used, base);
    } else {
        assert!(count <= avail_idx.wrapping_sub(used_idx));
        assert_eq!(first.next_used, used_idx);
        assert_eq!(first.next_avail, used_idx.wrapping_add(count));
    }
    drop(first.log);
    // Recovering again at once (a second crash before anything ran) says the same.
    let again = q
        .recover(&ring, used_head)
        .expect("a region just recovered is accepted again");
    if again.next_avail != base || !again.resubmit.is_empty() {
        assert_eq!(again.next_used, used_idx);
    }
    assert_eq!(again.resubmit.len(), count as usize);
}

/// The queue as the model sees it.
struct Model {
    size: u16,
    /// Heads the driver may still hand out.
    free: Vec<u16>,
    /// Heads taken and not completed, oldest first.
    in_flight: VecDeque<u16>,
    /// Every used element's head, by used index (wrapping).
    used: Vec<u16>,
    next_avail: u16,
    used_idx: u16,
}

fn model(input: &[u8]) {
    let Some((&geometry, ops)) = input.split_first() else {
        return;
    };
    let size = 1u16 << (geometry % 7);
    let (region_size, file) = InflightRegion::create(1, size).unwrap();
    let region = Arc::new(InflightRegion::map(&file, 0, region_size, 1, size).unwrap());
    let mut m = Model {
        size,
        free: (0..size).collect(),
        in_flight: VecDeque::new(),
        used: Vec::new(),
        next_avail: 0,
        used_idx: 0,
    };
    let mut log = recover(&region, &m).log;
    for &op in ops {
        let pick = usize::from(op >> 2);
        match op & 3 {
            // The driver makes a head available and the queue takes it.
            0 if !m.free.is_empty() => {
                let head = m.free.swap_remove(pick % m.free.len());
                log.taken(head);
                m.in_flight.push_back(head);
                m.next_avail = m.next_avail.wrapping_add(1);
            }
            // A request completes (any of those in flight: completions come out of order).
            1 if !m.in_flight.is_empty() => {
                let head = m.in_flight.remove(pick % m.in_flight.len()).unwrap();
                log.completing(head);
                m.used.push(head);
                m.used_idx = m.used_idx.wrapping_add(1);
                log.completed(head, m.used_idx);
                m.free.push(head);
            }
            // A crash halfway through a completion: the used index moved, the entry stayed.
            2 if !m.in_flight.is_empty() => {
                let head = m.in_flight.remove(pick % m.in_flight.len()).unwrap();
                log.completing(head);
                m.used.push(head);
                m.used_idx = m.used_idx.wrapping_add(1);
                m.free.push(head);
                log = crash(&region, &mut m);
            }
            3 => log = crash(&region, &mut m),
            _ => {}
        }
    }
}

/// Recovers the model's queue from the region.
fn recover(region: &Arc<InflightRegion>, m: &Model) -> aio_vhost_user_blk::inflight::Recovered {
    let ring = RingState {
        size: m.size,
        // QEMU's rewind after a crash: the used index.
        base: m.used_idx,
        avail_idx: m.next_avail,
        used_idx: m.used_idx,
    };
    let used = &m.used;
    let used_head = |i: u16| used.get(usize::from(i)).copied();
    region
        .queue(0)
        .unwrap()
        .recover(&ring, used_head)
        .expect("a region the log wrote is accepted")
}

/// A new backend: the recovery resubmits exactly the heads in flight, oldest first, and the
/// queue takes them again (as `VirtioBlkQueue` does) before anything new.
fn crash(region: &Arc<InflightRegion>, m: &mut Model) -> aio_vhost_user_blk::inflight::RegionLog {
    let got = recover(region, m);
    assert_eq!(Vec::from(m.in_flight.clone()), got.resubmit);
    assert_eq!(got.next_used, m.used_idx);
    assert_eq!(got.next_avail, m.next_avail);
    let mut log = got.log;
    for &head in &got.resubmit {
        log.taken(head);
    }
    log
}
