//! io_uring-specific behaviour: the probe, completion-queue overflow with a tiny ring, a full
//! submission queue, registered files, clearing the completion signal.

use aio_backend_uring::{probe, UringConfig, UringEngine};
use aio_core::engine::{AlignedBuf, IoEngine, Request};
use aio_core::testing::engine::{read_block, wait_for, TempFile};

use aio_core::testing::engine::BLOCK;

fn available() -> bool {
    aio_core::testing::available("io_uring unusable", probe()).is_some()
}

#[test]
fn probe_reports_the_opcodes_this_project_uses() {
    if !available() {
        return;
    }
    let support = probe().unwrap();
    for op in [
        "READ",
        "WRITE",
        "READV",
        "WRITEV",
        "FSYNC",
        "POLL_ADD",
        "POLL_REMOVE",
    ] {
        assert!(support.has(op), "{op} missing from {:?}", support.opcodes);
    }
    assert!(support.nodrop, "Linux 5.5+ keeps overflowed completions");
}

#[test]
fn a_tiny_ring_overflows_its_completion_queue_and_loses_nothing() {
    if !available() {
        return;
    }
    let mut engine = UringEngine::new(UringConfig {
        entries: 2,
        ..UringConfig::default()
    })
    .unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 5);
    let file = tmp.open(0).unwrap();
    for t in 0..300u64 {
        engine.submit(read_block(&file, t % 64, t)).unwrap();
    }
    // Nothing reaped yet: far more completions than the 4-entry CQ holds.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let done = wait_for(&mut engine, 300);
    let mut seen = vec![0u8; 300];
    for c in &done {
        assert_eq!(c.result.as_ref().unwrap(), &BLOCK);
        seen[c.token as usize] += 1;
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "every completion exactly once"
    );
    let stats = engine.stats();
    assert!(
        stats.cq_overflows > 0,
        "the CQ overflowed and was flushed: {stats:?}"
    );
    assert_eq!(engine.in_flight(), 0);
}

#[test]
fn a_full_submission_queue_queues_instead_of_failing() {
    if !available() {
        return;
    }
    let mut engine = UringEngine::new(UringConfig {
        entries: 4,
        ..UringConfig::default()
    })
    .unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 5);
    let file = tmp.open(0).unwrap();
    engine.plug();
    for t in 0..100u64 {
        engine.submit(read_block(&file, t % 64, t)).unwrap();
    }
    engine.unplug();
    let done = wait_for(&mut engine, 100);
    assert_eq!(done.len(), 100);
    assert!(engine.stats().sq_full > 0, "{:?}", engine.stats());
}

#[test]
fn registered_files_are_used_when_asked_for() {
    if !available() {
        return;
    }
    let mut engine = UringEngine::new(UringConfig {
        register_files: true,
        ..UringConfig::default()
    })
    .unwrap();
    let tmp = TempFile::with_len(8 * BLOCK, 5);
    let file = tmp.open(0).unwrap();
    for t in 0..8u64 {
        engine.submit(read_block(&file, t, t)).unwrap();
    }
    let done = engine.drain();
    assert!(done.iter().all(|c| c.result.as_ref().ok() == Some(&BLOCK)));
    assert_eq!(engine.stats().fixed_file_requests, 8);
    let mut plain = UringEngine::new(UringConfig::default()).unwrap();
    plain
        .submit(Request::read(&file, 0, AlignedBuf::new(BLOCK), 0))
        .unwrap();
    plain.drain();
    assert_eq!(plain.stats().fixed_file_requests, 0);
}

#[test]
fn clear_notifier_reads_the_eventfd_of_an_engine_with_its_own_ring() {
    if !available() {
        return;
    }
    let engine = UringEngine::new(UringConfig::default()).unwrap();
    engine.notifier().notify().unwrap();
    engine.clear_notifier();
    assert!(
        !engine.notifier().test_and_clear(),
        "the completion signal was consumed"
    );
}
