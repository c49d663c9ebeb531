//! Unit tests of [`LentMemory`]: its lengths and alignment, the copies in and out, the owned
//! forms and their ways back, and how long its hold lives (an in-flight table's request keeps
//! it until the completion is dropped).

use std::sync::{Arc, Weak};

use super::*;
use crate::engine::{IoFile, Request};
use crate::kit::InFlightTable;

/// Two segments of `mem` (100 bytes at 0, 300 at 200), held by `hold`.
fn two_segments(mem: &mut [u8], hold: Option<MemoryHold>) -> LentMemory {
    assert!(mem.len() >= 500);
    let base = mem.as_mut_ptr();
    // SAFETY: both segments lie inside `mem`, which each test keeps alive and untouched while
    // the value (and its hold) exists.
    unsafe { LentMemory::new([(base, 100), (base.wrapping_add(200), 300)], hold) }
}

#[test]
fn lengths_sum_the_segments_and_alignment_is_per_segment() {
    let mut mem = vec![0u8; 8192];
    let mut g = two_segments(&mut mem, None);
    assert_eq!((g.count(), g.len(), g.is_empty()), (2, 400, false));
    let align = DirectIoAlignment {
        memory: 1,
        offset: 100,
    };
    assert_eq!(g.misaligned(align), None);
    let align = DirectIoAlignment {
        memory: 1,
        offset: 200,
    };
    assert_eq!(g.misaligned(align).map(|m| m.0), Some(0));
    // SAFETY: inside `mem`, as above.
    unsafe { g.push(mem.as_mut_ptr().wrapping_add(1000), 24) };
    assert_eq!((g.count(), g.len()), (3, 424));
    // A length that cannot be real saturates rather than wraps (never submitted).
    // SAFETY: never read, written or submitted: only its length is looked at.
    unsafe { g.push(std::ptr::null_mut(), usize::MAX) };
    assert_eq!(g.len(), usize::MAX);
    let empty = LentMemory::empty(None);
    assert!(empty.is_empty() && empty.count() == 0 && empty.hold().is_none());
    let text = format!("{g:?}");
    assert!(
        text.contains("LentMemory") && text.contains("segments: 4"),
        "{text}"
    );
    drop(g);
    drop(mem);
}

#[test]
fn copies_go_in_segment_order_and_stop_at_the_shorter_side() {
    let mut mem = vec![0xeeu8; 512];
    let mut g = two_segments(&mut mem, None);
    let src: Vec<u8> = (0..=255u8).cycle().take(450).collect();
    assert_eq!(g.copy_in(&src), 400, "only what the segments hold");
    let mut out = vec![0u8; 1000];
    assert_eq!(g.copy_out(&mut out), 400);
    assert_eq!(&out[..400], &src[..400]);
    let mut head = [0u8; 150];
    assert_eq!(g.copy_out(&mut head), 150, "only what the slice holds");
    assert_eq!(&head[..], &src[..150]);
    g.zero();
    assert_eq!(g.copy_out(&mut out), 400);
    assert!(out[..400].iter().all(|&b| b == 0));
    drop(g);
    assert_eq!(
        &mem[100..200],
        &[0xee; 100][..],
        "the gap between the segments"
    );
    assert!(mem[..100].iter().chain(&mem[200..500]).all(|&b| b == 0));
    assert!(
        mem[500..].iter().all(|&b| b == 0xee),
        "past the last segment"
    );
}

#[test]
fn a_vector_round_trips_and_comes_back_only_once_nothing_else_holds_it() {
    let data: Vec<u8> = (0..=255u8).collect();
    let lent = LentMemory::from_vec(data.clone());
    assert_eq!((lent.len(), lent.count()), (256, 1));
    let mut out = vec![0u8; 256];
    assert_eq!(lent.copy_out(&mut out), 256);
    assert_eq!(out, data, "the segment is the vector's memory");
    // A part lent on (as the block layer lends parts of a request) keeps a clone of the hold:
    // the vector does not come back while it lives.
    let part = lent.hold().cloned();
    let lent = lent.into_vec().expect_err("a part of it is still lent");
    drop(part);
    assert_eq!(lent.into_vec().expect("ours alone now"), data);
    // Memory that is no owned vector comes back as it is.
    let mut mem = vec![0u8; 512];
    let hold: MemoryHold = Arc::new(());
    let other = two_segments(&mut mem, Some(hold));
    let other = other.into_vec().expect_err("not a vector");
    assert!(other.hold().is_some(), "its hold is kept");
    assert!(LentMemory::empty(None).into_vec().is_err());
}

#[test]
fn an_aligned_buffer_comes_back_once_every_hold_is_gone() {
    let (lent, back) = LentMemory::from_aligned(AlignedBuf::from_slice(&[7; 4096]));
    assert_eq!(
        lent.as_iovecs()[0].iov_base as usize % 4096,
        0,
        "still aligned"
    );
    let back = back.take().expect_err("the memory is still lent");
    let part = lent.hold().cloned();
    drop(lent);
    let back = back.take().expect_err("a part of it is still lent");
    drop(part);
    let buf = back.take().expect("nothing holds it");
    assert!(buf.iter().all(|&b| b == 7));
}

/// A hold that says when it is gone.
fn watched() -> (MemoryHold, Weak<dyn std::any::Any + Send + Sync>) {
    let hold: MemoryHold = Arc::new(());
    let weak = Arc::downgrade(&hold);
    (hold, weak)
}

#[test]
fn the_hold_lives_until_the_completion_that_hands_the_memory_back_is_dropped() {
    let f = IoFile::dup(std::fs::File::open("/dev/null").unwrap()).unwrap();
    let mut mem = vec![0u8; 512];
    let (hold, weak) = watched();
    let lent = two_segments(&mut mem, Some(hold));
    let mut table = InFlightTable::new();
    let slot = table.insert(Request::read_guest(&f, 0, lent, 9));
    assert_eq!(
        weak.strong_count(),
        1,
        "held while the request is in flight"
    );
    table.complete(slot, Ok(400));
    assert_eq!(
        weak.strong_count(),
        1,
        "held by the completion waiting to be handed out"
    );
    let mut out = std::collections::VecDeque::new();
    assert_eq!(table.take_done(&mut out), 1);
    let done = out.pop_front().unwrap();
    assert_eq!(weak.strong_count(), 1, "held by the completion");
    let back = done.buf.into_guest().expect("the memory comes back");
    assert_eq!(back.len(), 400);
    drop(back);
    assert_eq!(
        weak.strong_count(),
        0,
        "released with the memory, not before"
    );
    drop(mem);
}

#[test]
#[allow(deprecated)]
fn the_old_name_is_the_one_type() {
    let old: GuestIovecs = LentMemory::from_vec(vec![1, 2, 3]);
    assert_eq!(old.into_vec().expect("the vector back"), [1, 2, 3]);
}
