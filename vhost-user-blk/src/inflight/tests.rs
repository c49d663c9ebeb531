//! The region's geometry checks, its log and its recovery, on real memfds.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use aio_virtio_blk::inflight::InflightLog;

use super::*;

/// A region made as `GET_INFLIGHT_FD` makes it, mapped as `SET_INFLIGHT_FD` maps it.
fn region(queues: u16, queue_size: u16) -> (Arc<InflightRegion>, File) {
    let (size, file) = InflightRegion::create(queues, queue_size).expect("create");
    let region = InflightRegion::map(&file, 0, size, queues, queue_size).expect("map");
    (Arc::new(region), file)
}

/// A ring of `size` heads whose used ring is empty; `avail` made available.
fn ring(size: u16, avail: u16, used: u16) -> RingState {
    RingState {
        size,
        base: used,
        avail_idx: avail,
        used_idx: used,
    }
}

fn no_used(_: u16) -> Option<u16> {
    None
}

/// Starts queue `q` fresh and gives its log.
fn fresh_log(region: &Arc<InflightRegion>, q: u16, size: u16) -> RegionLog {
    let r = region.queue(q).unwrap().recover(&ring(size, 0, 0), no_used);
    r.expect("fresh").log
}

#[test]
fn the_stride_is_libvhost_users() {
    assert_eq!(queue_stride(128), 2112);
    assert_eq!(queue_stride(256), 4160);
    assert_eq!(queue_stride(1), 64);
    assert_eq!(region_size(2, 128), 4224);
}

#[test]
fn a_created_region_is_sized_sealed_and_names_its_entries() {
    let (size, file) = InflightRegion::create(2, 128).expect("create");
    assert_eq!(size, region_size(2, 128));
    assert_eq!(file.metadata().unwrap().len(), size);
    assert!(
        file.set_len(size / 2).is_err(),
        "the memfd is sealed against shrinking"
    );
    let region = Arc::new(InflightRegion::map(&file, 0, size, 2, 128).unwrap());
    for q in 0..2 {
        let header = region.queue(q).unwrap();
        assert_eq!(header.header().desc_num.load(Ordering::Acquire), 128);
        assert_eq!(header.header().version.load(Ordering::Acquire), 0);
    }
}

#[test]
fn a_bad_geometry_is_refused_before_mapping() {
    let (size, file) = InflightRegion::create(2, 128).unwrap();
    let map = |offset, size, queues, qs| InflightRegion::map(&file, offset, size, queues, qs);
    assert!(matches!(
        map(0, size - 1, 2, 128),
        Err(InflightError::TooSmall { .. })
    ));
    assert!(matches!(
        map(0, size, 2, 100),
        Err(InflightError::QueueSize(100))
    ));
    assert!(matches!(
        map(0, size, 2, 0),
        Err(InflightError::QueueSize(0))
    ));
    assert!(matches!(
        map(0, size, 0, 128),
        Err(InflightError::QueueCount(0))
    ));
    assert!(matches!(
        map(100, size, 2, 128),
        Err(InflightError::Offset(100))
    ));
    assert!(matches!(
        map(4096, size, 2, 128),
        Err(InflightError::FileTooShort { .. })
    ));
    assert!(matches!(
        map(0, size, 3, 128),
        Err(InflightError::TooSmall { .. })
    ));
    let e = map(0, 64, 2, 128).unwrap_err();
    assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidData);
    let region = Arc::new(map(0, size, 2, 128).unwrap());
    assert!(matches!(
        region.queue(2),
        Err(InflightError::NoSuchQueue {
            queue: 2,
            queues: 2
        })
    ));
}

#[test]
fn a_fresh_queue_starts_at_the_vring_base_and_is_marked_in_use() {
    let (region, _file) = region(1, 64);
    let r = region.queue(0).unwrap();
    let got = r.recover(&ring(64, 9, 7), no_used).expect("fresh");
    assert_eq!((got.next_avail, got.next_used), (7, 7));
    assert!(got.resubmit.is_empty());
    let h = region.queue(0).unwrap();
    assert_eq!(h.header().version.load(Ordering::Acquire), VERSION);
    assert_eq!(h.header().used_idx.load(Ordering::Acquire), 7);
    // A ring larger than the region's entries is refused, fresh or not.
    let (region, _file) = super::tests::region(1, 16);
    let e = region.queue(0).unwrap().recover(&ring(32, 0, 0), no_used);
    assert!(matches!(
        e,
        Err(InflightError::DescNum {
            ring_size: 32,
            room: 16,
            ..
        })
    ));
}

#[test]
fn heads_left_in_flight_are_resubmitted_oldest_first() {
    let (region, _file) = region(2, 64);
    let mut log = fresh_log(&region, 1, 64);
    // Taken in the order 9, 3, 40, 5; 3 completes (used index 1).
    for head in [9, 3, 40, 5] {
        log.taken(head);
    }
    log.completing(3);
    log.completed(3, 1);
    drop(log);
    let got = region.queue(1).unwrap().recover(&ring(64, 4, 1), no_used);
    let got = got.expect("recover");
    assert_eq!(got.resubmit, [9, 40, 5]);
    assert_eq!((got.next_avail, got.next_used), (4, 1));
    assert_eq!((got.repaired, got.ignored), (0, 0));
    // The next head taken is younger than every resubmitted one.
    let mut log = got.log;
    log.taken(7);
    let entries = region.queue(1).unwrap();
    let counter = |h: usize| entries.entries()[h].counter.load(Ordering::Acquire);
    assert!(counter(7) > counter(5) && counter(5) > counter(40));
    // Queue 0 was never touched.
    let q0 = region.queue(0).unwrap();
    assert_eq!(q0.header().version.load(Ordering::Acquire), 0);
}

#[test]
fn a_torn_last_batch_is_repaired_from_the_used_ring() {
    let (region, _file) = region(1, 16);
    let mut log = fresh_log(&region, 0, 16);
    log.taken(2);
    log.taken(6);
    // Died after publishing 6 (used index 0 -> 1) and before clearing its entry.
    log.completing(6);
    drop(log);
    let used = |i: u16| (i == 0).then_some(6);
    let got = region.queue(0).unwrap().recover(&ring(16, 2, 1), used);
    let got = got.expect("recover");
    assert_eq!(got.resubmit, [2]);
    assert_eq!(got.repaired, 1);
    assert_eq!((got.next_avail, got.next_used), (2, 1));
    let q = region.queue(0).unwrap();
    assert_eq!(q.header().used_idx.load(Ordering::Acquire), 1);
    assert_eq!(q.entries()[6].inflight.load(Ordering::Acquire), 0);
}

#[test]
fn indices_wrap_around() {
    let (region, _file) = region(1, 8);
    let q = region.queue(0).unwrap();
    q.recover(&ring(8, 65534, 65534), no_used).expect("fresh");
    let q = region.queue(0).unwrap();
    let mut log = q.recover(&ring(8, 65534, 65534), no_used).unwrap().log;
    log.taken(1);
    log.taken(2);
    log.completing(1);
    log.completed(1, 65535);
    log.completing(2);
    drop(log);
    // 2 was published at used index 65535 -> 0; the region still says 65535.
    let used = |i: u16| (i == 65535).then_some(2);
    let got = region.queue(0).unwrap().recover(&ring(8, 0, 0), used);
    let got = got.expect("recover");
    assert!(got.resubmit.is_empty());
    assert_eq!((got.next_avail, got.next_used, got.repaired), (0, 0, 1));
}

#[test]
fn bad_entries_are_ignored_and_cleared() {
    let (region, _file) = region(1, 16);
    let q = region.queue(0).unwrap();
    q.clone().recover(&ring(8, 0, 0), no_used).expect("fresh");
    let entries = q.entries();
    entries[1].inflight.store(1, Ordering::Release);
    entries[4].inflight.store(7, Ordering::Release); // not 0 or 1
    entries[12].inflight.store(1, Ordering::Release); // beyond a ring of 8
    let got = q.clone().recover(&ring(8, 3, 0), no_used).expect("recover");
    assert_eq!(got.resubmit, [1]);
    assert_eq!(got.ignored, 2);
    assert_eq!(entries[4].inflight.load(Ordering::Acquire), 0);
    assert_eq!(entries[12].inflight.load(Ordering::Acquire), 0);
}

#[test]
fn duplicate_counters_order_by_head() {
    let (region, _file) = region(1, 16);
    let q = region.queue(0).unwrap();
    q.clone().recover(&ring(16, 0, 0), no_used).expect("fresh");
    for (head, counter) in [(9usize, 5u64), (2, 5), (4, 1)] {
        q.entries()[head].counter.store(counter, Ordering::Release);
        q.entries()[head].inflight.store(1, Ordering::Release);
    }
    let got = q.recover(&ring(16, 3, 0), no_used).expect("recover");
    assert_eq!(got.resubmit, [4, 2, 9]);
}

#[test]
fn a_region_that_contradicts_the_ring_refuses_the_queue() {
    let (region, _file) = region(1, 16);
    let q = region.queue(0).unwrap();
    q.clone().recover(&ring(16, 0, 0), no_used).expect("fresh");
    for head in 0..3 {
        q.entries()[head].inflight.store(1, Ordering::Release);
    }
    // Three in flight, but only two made available past the used index.
    let e = q.clone().recover(&ring(16, 2, 0), no_used).unwrap_err();
    assert!(matches!(
        e,
        InflightError::TooManyInFlight {
            marked: 3,
            available: 2,
            ..
        }
    ));
    // The region's used index ahead of the ring's, with heads marked.
    q.header().used_idx.store(5, Ordering::Release);
    let e = q.clone().recover(&ring(16, 8, 2), no_used).unwrap_err();
    assert!(
        matches!(
            e,
            InflightError::UsedIndex {
                region: 5,
                ring: 2,
                ..
            }
        ),
        "{e}"
    );
    // With nothing marked, a ring set up anew: the region follows it.
    let entries = q.entries();
    (0..3).for_each(|h| entries[h].inflight.store(0, Ordering::Release));
    let got = q
        .clone()
        .recover(&ring(16, 0, 0), no_used)
        .expect("a new ring");
    assert_eq!((got.next_avail, got.next_used, got.repaired), (0, 0, 0));
    assert_eq!(q.header().used_idx.load(Ordering::Acquire), 0);
    (0..3).for_each(|h| entries[h].inflight.store(1, Ordering::Release));
    q.header().used_idx.store(5, Ordering::Release);
    // A version this module does not know.
    q.header().version.store(3, Ordering::Release);
    let e = q.clone().recover(&ring(16, 8, 5), no_used).unwrap_err();
    assert!(matches!(e, InflightError::Version { version: 3, .. }));
    // Fewer entries than the ring has heads, or more than the stride holds.
    q.header().version.store(VERSION, Ordering::Release);
    q.header().desc_num.store(8, Ordering::Release);
    let e = q.clone().recover(&ring(16, 8, 5), no_used).unwrap_err();
    assert!(matches!(
        e,
        InflightError::DescNum {
            desc_num: 8,
            ring_size: 16,
            ..
        }
    ));
    q.header().desc_num.store(17, Ordering::Release);
    let e = q.recover(&ring(16, 8, 5), no_used).unwrap_err();
    assert!(matches!(
        e,
        InflightError::DescNum {
            desc_num: 17,
            room: 16,
            ..
        }
    ));
}

#[test]
fn heads_beyond_the_entries_are_not_logged() {
    let (region, _file) = region(1, 8);
    let mut log = fresh_log(&region, 0, 8);
    log.taken(8);
    log.taken(u16::MAX);
    log.completed(u16::MAX, 1);
    let q = region.queue(0).unwrap();
    assert!(q
        .entries()
        .iter()
        .all(|e| e.inflight.load(Ordering::Acquire) == 0));
}
