//! How the engine sends what is queued: in batches by the batch rule (each as large as what
//! the kernel already holds), a vector as one entry, a short read's remainder sent back, and,
//! on a ring shared with the fd monitor, a partial round left in the submission queue for the
//! monitor's next wait.
//!
//! The requests are reads of an empty pipe: they stay in the kernel until the write end
//! closes, so what the engine sent can be counted before anything completes.

use aio_backend_uring::UringConfig;
use aio_conformance::engine::{wait_for, BLOCK};
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request};

mod common;

#[test]
fn a_plugged_queue_goes_out_in_batches_as_large_as_what_the_kernel_holds() {
    if !common::available() {
        return;
    }
    let mut engine = common::engine(UringConfig::default());
    let (read_end, write_end) = common::pipe();
    let read_end = IoFile::from(read_end);
    engine.plug();
    // Batches of 1, 1, 2 and 4: each goes once as many are queued as the kernel holds.
    let mut sent = Vec::new();
    for token in 0..8 {
        engine.submit(common::pipe_read(&read_end, token)).unwrap();
        sent.push(engine.in_kernel());
    }
    assert_eq!(sent, [1, 2, 2, 4, 4, 4, 4, 8]);
    let stats = engine.stats();
    assert_eq!(
        (stats.submit_calls, stats.entries_submitted),
        (4, 8),
        "{stats:?}"
    );
    engine.unplug();
    // Nothing to reap and nothing waiting in the submission queue: no enter.
    let mut out = std::collections::VecDeque::new();
    engine.poll_completions(&mut out);
    assert!(out.is_empty());
    assert_eq!(engine.stats().submit_calls, 4);
    common::finish(engine, write_end, 8);
}

#[test]
fn a_shared_ring_leaves_a_partial_round_to_the_monitors_next_wait() {
    if !common::available() {
        return;
    }
    let (_monitor, mut engine) = common::shared(UringConfig::default());
    let (read_end, write_end) = common::pipe();
    let read_end = IoFile::from(read_end);
    // The first request to an idle ring is a whole round (the batch rule's one): it goes now,
    // and so does the second (a round of one, the kernel holding one).
    for token in 0..2 {
        engine.submit(common::pipe_read(&read_end, token)).unwrap();
    }
    let stats = engine.stats();
    assert_eq!(
        (stats.submit_calls, stats.entries_submitted),
        (2, 2),
        "{stats:?}"
    );
    // With two in the kernel a round is two: one request alone waits in the submission queue,
    // counted as the kernel's, for the next enter.
    engine.submit(common::pipe_read(&read_end, 2)).unwrap();
    let stats = engine.stats();
    assert_eq!(
        (stats.submit_calls, stats.entries_submitted),
        (2, 2),
        "{stats:?}"
    );
    assert_eq!(engine.in_kernel(), 3);
    // Polling for completions with none to reap makes sure it reaches the kernel.
    let mut out = std::collections::VecDeque::new();
    engine.poll_completions(&mut out);
    assert!(out.is_empty());
    let stats = engine.stats();
    assert_eq!(
        (stats.submit_calls, stats.entries_submitted),
        (3, 3),
        "{stats:?}"
    );
    common::finish(engine, write_end, 3);
}

#[test]
fn a_vector_goes_out_as_one_entry() {
    if !common::available() {
        return;
    }
    // One readv of four blocks: one READV entry and one completion, not the first block and
    // then the rest as a remainder.
    let mut engine = common::engine(UringConfig::default());
    let tmp = aio_conformance::engine::TempFile::with_len(4 * BLOCK, 6);
    let file = tmp.open(0).unwrap();
    let bufs = (0..4).map(|_| AlignedBuf::new(BLOCK)).collect();
    engine.submit(Request::readv(&file, 0, bufs, 9)).unwrap();
    let done = wait_for(&mut engine, 1);
    assert_eq!(done[0].result.as_ref().ok(), Some(&(4 * BLOCK)));
    let stats = engine.stats();
    assert_eq!((stats.entries_submitted, stats.cqes), (1, 1), "{stats:?}");
    assert_eq!(stats.resubmits, 0, "no remainder went back: {stats:?}");
}

#[test]
fn a_short_read_at_the_end_of_a_file_goes_back_for_the_rest() {
    if !common::available() {
        return;
    }
    // Five blocks asked for where two exist: the kernel's short read is resubmitted once for
    // the remainder, which finds the end of the file.
    let mut engine = common::engine(UringConfig::default());
    let tmp = aio_conformance::engine::TempFile::with_len(3 * BLOCK, 9);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    let bufs = vec![AlignedBuf::new(BLOCK), AlignedBuf::new(4 * BLOCK)];
    engine
        .submit(Request::readv(&file, BLOCK as u64, bufs, 1))
        .unwrap();
    let done = wait_for(&mut engine, 1);
    assert_eq!(done[0].result.as_ref().ok(), Some(&(2 * BLOCK)));
    assert_eq!(engine.stats().resubmits, 1, "{:?}", engine.stats());
}
