//! io_uring-specific behaviour: the probe, completion-queue overflow with a tiny ring, a full
//! submission queue, registered files and buffers, clearing the completion signal, signals in
//! the engine's wait, cancels in the kernel (the task-work modes are `task_run.rs`).

use std::collections::VecDeque;

use aio_backend_uring::{probe, UringConfig, UringEngine};
use aio_conformance::engine::{read_block, wait_for, TempFile};
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request, RwFlags};

use aio_conformance::engine::BLOCK;

mod common;

#[test]
fn probe_reports_the_opcodes_this_project_uses() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test("probe_reports_the_opcodes_this_project_uses", || {
        let support = probe().unwrap();
        for op in [
            "READ",
            "WRITE",
            "READV",
            "WRITEV",
            "FSYNC",
            "FALLOCATE",
            "POLL_ADD",
            "POLL_REMOVE",
        ] {
            assert!(support.has(op), "{op} missing from {:?}", support.opcodes);
        }
        assert!(support.nodrop, "Linux 5.5+ keeps overflowed completions");
    });
}

#[test]
fn a_tiny_ring_overflows_its_completion_queue_and_loses_nothing() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test(
        "a_tiny_ring_overflows_its_completion_queue_and_loses_nothing",
        || {
            let mut engine = common::engine(UringConfig::default().with_entries(2));
            let tmp = TempFile::with_len(64 * BLOCK, 5);
            let file = tmp.open(0).unwrap();
            for t in 0..300u64 {
                engine.submit(read_block(&file, t % 64, t)).unwrap();
            }
            // Nothing reaped yet: page-cache reads complete during submission, far more of them than
            // the 4-entry CQ holds (the overflow count below proves it happened).
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
        },
    );
}

#[test]
fn a_full_submission_queue_queues_instead_of_failing() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test("a_full_submission_queue_queues_instead_of_failing", || {
        let mut engine = common::engine(UringConfig::default().with_entries(4));
        let tmp = TempFile::with_len(64 * BLOCK, 5);
        let file = tmp.open(0).unwrap();
        engine.plug();
        for t in 0..100u64 {
            engine.submit(read_block(&file, t % 64, t)).unwrap();
        }
        engine.unplug();
        let done = wait_for(&mut engine, 100);
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert!(engine.stats().sq_full > 0, "{:?}", engine.stats());
    });
}

#[test]
fn registered_files_are_used_when_asked_for() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test("registered_files_are_used_when_asked_for", || {
        let mut engine = common::engine(UringConfig::default().with_register_files(true));
        let tmp = TempFile::with_len(8 * BLOCK, 5);
        let file = tmp.open(0).unwrap();
        for t in 0..8u64 {
            engine.submit(read_block(&file, t, t)).unwrap();
        }
        let done = engine.drain();
        assert!(done.iter().all(|c| c.result.as_ref().ok() == Some(&BLOCK)));
        assert_eq!(engine.stats().fixed_file_requests, 8);
        let mut plain = common::engine(UringConfig::default());
        plain
            .submit(Request::read(&file, 0, AlignedBuf::new(BLOCK), 0))
            .unwrap();
        plain.drain();
        assert_eq!(plain.stats().fixed_file_requests, 0);
    });
}

#[test]
fn clear_notifier_reads_the_eventfd_of_an_engine_with_its_own_ring() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test(
        "clear_notifier_reads_the_eventfd_of_an_engine_with_its_own_ring",
        || {
            let engine = common::engine(UringConfig::default());
            engine.notifier().notify().unwrap();
            engine.clear_notifier();
            assert!(
                !engine.notifier().test_and_clear(),
                "the completion signal was consumed"
            );
        },
    );
}

#[test]
fn registered_buffers_are_registered_once_and_reused() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test("registered_buffers_are_registered_once_and_reused", || {
        let mut engine = common::engine(UringConfig::default().with_fixed_buffers(2));
        let tmp = TempFile::with_len(8 * BLOCK, 0);
        let file = tmp.open(libc::O_DIRECT).unwrap();
        // One buffer going round: written with its block's number, then read back into it.
        let mut buf = AlignedBuf::new(BLOCK);
        for block in 0..8u64 {
            buf.fill(block as u8 + 1);
            engine
                .submit(Request::write(&file, block * BLOCK as u64, buf, block))
                .unwrap();
            let mut done = wait_for(&mut engine, 1);
            assert_eq!(done[0].result.as_ref().unwrap(), &BLOCK);
            buf = done.pop().unwrap().buf.into_one().unwrap();
        }
        for block in 0..8u64 {
            buf.fill(0);
            engine
                .submit(Request::read(&file, block * BLOCK as u64, buf, block))
                .unwrap();
            let mut done = wait_for(&mut engine, 1);
            assert_eq!(done[0].result.as_ref().unwrap(), &BLOCK);
            buf = done.pop().unwrap().buf.into_one().unwrap();
            assert!(buf.iter().all(|&b| b == block as u8 + 1), "block {block}");
        }
        let stats = engine.stats();
        if let Some(e) = engine.fixed_buffers_error() {
            // Registered buffers count against the locked-memory limit, a budget of the
            // user that the tests beside this one share (an unprivileged container's 64
            // KiB): the kernel refused the registration, and the reads went unregistered.
            if e.raw_os_error() == Some(libc::ENOMEM) {
                aio_conformance::skip_test(format!("registered buffers: {e}"));
            }
            panic!("registered buffers refused: {e}");
        }
        assert_eq!(stats.fixed_buffer_requests, 16, "{stats:?}");
        assert_eq!(
            stats.buffer_registrations, 1,
            "one allocation, one registration"
        );
        // A new allocation (even at the freed buffer's address) is registered anew.
        drop(buf);
        engine.submit(read_block(&file, 3, 99)).unwrap();
        let done = wait_for(&mut engine, 1);
        let read = done.into_iter().next().unwrap().buf.into_one().unwrap();
        assert!(read.iter().all(|&b| b == 4));
        assert_eq!(engine.stats().buffer_registrations, 2);
    });
}

#[test]
fn more_buffers_in_flight_than_slots_go_without_and_all_complete() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test(
        "more_buffers_in_flight_than_slots_go_without_and_all_complete",
        || {
            let mut engine = common::engine(UringConfig::default().with_fixed_buffers(4));
            let tmp = TempFile::with_len(64 * BLOCK, 7);
            let file = tmp.open(libc::O_DIRECT).unwrap();
            engine.plug();
            for t in 0..64u64 {
                engine.submit(read_block(&file, t, t)).unwrap();
            }
            engine.unplug();
            let done = wait_for(&mut engine, 64);
            assert_eq!(done.len(), 64);
            for c in done {
                assert_eq!(c.result.as_ref().unwrap(), &BLOCK);
                assert!(c.buf.into_one().unwrap().iter().all(|&b| b == 7));
            }
            let stats = engine.stats();
            assert!(stats.fixed_buffer_requests >= 4, "{stats:?}");
            assert!(stats.fixed_buffer_requests < 64, "{stats:?}");
        },
    );
}

#[test]
fn bad_settings_are_errors_that_name_the_field() {
    use aio_backend_uring::UringUnavailable;
    for (config, field) in [
        (
            UringConfig::default()
                .with_fixed_buffers(aio_backend_uring::MAX_REGISTERED_BUFFERS + 1),
            "fixed_buffers",
        ),
        (UringConfig::default().with_entries(0), "entries"),
        (
            UringConfig::default().with_entries(aio_backend_uring::MAX_ENTRIES + 1),
            "entries",
        ),
        (UringConfig::default().with_max_batch(0), "max_batch"),
        (
            UringConfig::default().with_io_workers(Some(0)),
            "io_workers",
        ),
    ] {
        // Refused before any ring is set up: no io_uring needed.
        match UringEngine::new(config) {
            Err(e @ UringUnavailable::BadConfig(_)) => {
                let UringUnavailable::BadConfig(bad) = &e else {
                    unreachable!()
                };
                assert_eq!((bad.config, bad.field), ("UringConfig", field));
                assert!(e.to_string().contains(field), "{e}");
                let io: std::io::Error = e.into();
                assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    // The shared ring checks the same settings before it sets a ring up.
    let e = aio_backend_uring::shared_ring(UringConfig::default().with_entries(0)).unwrap_err();
    assert!(matches!(e, UringUnavailable::BadConfig(_)), "{e}");
    if common::available() {
        aio_conformance::run_test("the settings the kernel takes", || {
            // Its CQ (four entries per SQ entry) is capped at the kernel's limit.
            let big = UringConfig::default().with_entries(aio_backend_uring::MAX_ENTRIES);
            drop(common::shared(big));
            // A worker limit the kernel takes, on both kinds of ring.
            let one = UringConfig::default().with_io_workers(Some(1));
            drop(common::engine(one));
            drop(common::shared(one));
        });
    }
}

#[test]
fn range_ops_on_one_file_are_linked_and_all_complete() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test("range_ops_on_one_file_are_linked_and_all_complete", || {
        // One io-wq worker, and the discards hard-linked in submission batches: every one
        // completes, each with its length, also when one in the middle fails.
        let mut engine = common::engine(UringConfig::default().with_io_workers(Some(1)));
        let tmp = TempFile::with_len(64 * BLOCK, 1);
        let file = tmp.open(0).unwrap();
        engine.plug();
        for i in 0..64u64 {
            // Past the file system's largest file (ext4: 16 TiB) a discard fails with EFBIG, and
            // must not cancel the ones linked after it (tmpfs takes it).
            let at = if i == 10 { 1 << 50 } else { i * BLOCK as u64 };
            engine
                .submit(Request::discard(&file, at, BLOCK as u64, i))
                .unwrap();
        }
        engine.unplug();
        let mut done = wait_for(&mut engine, 64);
        done.sort_by_key(|c| c.token);
        for c in &done {
            if c.token == 10 {
                assert!(c.result.is_ok() || c.errno() == Some(libc::EFBIG), "{c:?}");
            } else {
                assert_eq!(c.result.as_ref().ok(), Some(&BLOCK), "{c:?}");
            }
        }
        assert!(engine.stats().linked_range_ops > 0, "{:?}", engine.stats());
        let data = tmp.contents();
        assert!(data[..10 * BLOCK].iter().all(|&b| b == 0));
        assert!(data[10 * BLOCK..11 * BLOCK].iter().all(|&b| b == 1));
        assert!(data[11 * BLOCK..].iter().all(|&b| b == 0));
    });
}

#[test]
fn range_ops_on_different_files_are_not_linked() {
    if !common::available() {
        return;
    }
    // A link orders range ops on one file; discards alternating between two files run apart.
    let mut engine = common::engine(UringConfig::default());
    let (a, b) = (
        TempFile::with_len(8 * BLOCK, 1),
        TempFile::with_len(8 * BLOCK, 1),
    );
    let files = [a.open(0).unwrap(), b.open(0).unwrap()];
    engine.plug();
    for i in 0..8u64 {
        let file = &files[i as usize % 2];
        engine
            .submit(Request::discard(file, i * BLOCK as u64, BLOCK as u64, i))
            .unwrap();
    }
    engine.unplug();
    let done = wait_for(&mut engine, 8);
    assert!(
        done.iter().all(|c| c.result.as_ref().ok() == Some(&BLOCK)),
        "{done:?}"
    );
    assert_eq!(engine.stats().linked_range_ops, 0, "{:?}", engine.stats());
}

#[test]
fn reads_in_one_batch_are_not_linked() {
    if !common::available() {
        return;
    }
    // Only range ops are hard-linked: reads of one file in one submission run side by side.
    let mut engine = common::engine(UringConfig::default());
    let tmp = TempFile::with_len(8 * BLOCK, 3);
    let file = tmp.open(0).unwrap();
    engine.plug();
    for i in 0..8u64 {
        engine.submit(read_block(&file, i, i)).unwrap();
    }
    engine.unplug();
    let done = wait_for(&mut engine, 8);
    assert!(done.iter().all(|c| c.result.as_ref().ok() == Some(&BLOCK)));
    let stats = engine.stats();
    assert_eq!(stats.linked_range_ops, 0, "{stats:?}");
    assert_eq!(stats.cqes, 8, "one completion entry each: {stats:?}");
}

#[test]
fn the_engine_reports_the_ring_it_set_up() {
    if !common::available() {
        return;
    }
    let engine = common::engine(UringConfig::default().with_entries(64));
    let entries = engine.sq_entries();
    // 64, or halved down to 8 where the locked-memory limit refused the larger ring.
    assert!(
        (8..=64).contains(&entries) && entries.is_power_of_two(),
        "{entries}"
    );
    assert_eq!(engine.name(), "uring");
    assert!(!engine.is_shared(), "an engine with its own ring");
    assert!(
        engine.fixed_buffers_error().is_none(),
        "no registered buffers asked for, so none refused"
    );
    assert_eq!(engine.in_kernel(), 0);
}

#[test]
fn a_signal_that_interrupts_the_engines_wait_is_counted_and_retried() {
    use std::io::Write;
    use std::time::Duration;
    if !common::available() {
        return;
    }
    let mut engine = common::engine(UringConfig::default());
    // An empty pipe: `drain` blocks in io_uring_enter until the writer fills it, after a
    // signal of its own has interrupted the wait, while the storm interrupts it every 20 µs.
    let (read_end, mut write_end) = common::pipe();
    let file = IoFile::from(read_end);
    engine
        .submit(Request::read(&file, 0, AlignedBuf::new(512), 9))
        .unwrap();
    let storm = aio_conformance::SignalStorm::start(Duration::from_micros(20));
    // SAFETY: gettid has no preconditions.
    let (reader, pid) = unsafe { (libc::gettid(), libc::getpid()) };
    let writer = std::thread::spawn(move || {
        // The reader's one sleep from here on is the engine's wait in io_uring_enter. Once it
        // is there, a signal of the writer's own interrupts it whatever the storm's thread got
        // to do; once it sleeps again, the interruption has been retried.
        let sleeping = || aio_conformance::wait_until_sleeping(reader, Duration::from_secs(30));
        assert!(sleeping(), "the engine never waited");
        // SAFETY: tgkill to a thread of this process, which has a SIGURG handler (the storm's).
        unsafe { libc::syscall(libc::SYS_tgkill, pid, reader, libc::SIGURG) };
        assert!(sleeping(), "the engine did not wait again after the signal");
        write_end.write_all(&[3; 512]).unwrap();
        write_end
    });
    let done = engine.drain();
    drop(storm);
    drop(writer.join().unwrap());
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].result.as_ref().ok(),
        Some(&512),
        "{:?}",
        done[0].result
    );
    let stats = engine.stats();
    assert!(
        stats.interrupted_calls > 0,
        "no wait was interrupted: {stats:?}"
    );
}

#[test]
fn fua_writes_are_counted_and_a_file_discard_is_fallocate() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test(
        "fua_writes_are_counted_and_a_file_discard_is_fallocate",
        || {
            let mut engine = common::engine(UringConfig::default());
            let tmp = TempFile::with_len(64 * BLOCK, 5);
            let file = tmp.open(libc::O_DIRECT).unwrap();
            let write = Request::write(&file, 0, AlignedBuf::from_slice(&[8; BLOCK]), 1);
            engine.submit(write.with_flags(RwFlags::FUA)).unwrap();
            engine.submit(read_block(&file, 2, 2)).unwrap();
            engine
                .submit(Request::discard(
                    &file,
                    32 * BLOCK as u64,
                    32 * BLOCK as u64,
                    3,
                ))
                .unwrap();
            let done = wait_for(&mut engine, 3);
            assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
            let stats = engine.stats();
            assert_eq!(stats.fua_writes, 1);
            assert_eq!(
                stats.entries_submitted, 3,
                "the discard went to the ring, not a thread"
            );
            let data = tmp.contents();
            assert_eq!(data[..BLOCK], [8; BLOCK]);
            assert!(data[32 * BLOCK..].iter().all(|&b| b == 0));
        },
    );
}

#[test]
fn a_request_in_the_kernel_is_cancelled_with_async_cancel() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test(
        "a_request_in_the_kernel_is_cancelled_with_async_cancel",
        || {
            // A read of an empty pipe waits in the kernel until cancelled.
            let pipe = aio_conformance::Pipe::new();
            let read_end = IoFile::new(pipe.read);
            let mut engine = common::engine(UringConfig::default());
            engine
                .submit(Request::read(&read_end, 0, AlignedBuf::new(64), 7))
                .unwrap();
            // Give the kernel the request (it arms a poll on the pipe and waits).
            let mut out = VecDeque::new();
            engine.poll_completions(&mut out);
            assert!(out.is_empty(), "nothing to read yet");
            assert_eq!(engine.in_kernel(), 1);
            let calls = engine.stats().submit_calls;
            assert!(engine.cancel(7), "the cancel is sent");
            let stats = engine.stats();
            assert_eq!(stats.submit_calls, calls + 1, "in one enter");
            assert_eq!(
                stats.entries_submitted, 2,
                "the read and its cancel: {stats:?}"
            );
            let done = wait_for(&mut engine, 1);
            assert_eq!(done[0].token, 7);
            assert_eq!(done[0].errno(), Some(libc::ECANCELED));
            assert_eq!(done[0].buf.count(), 1, "the buffer comes back");
            assert_eq!(engine.stats().cancels_sent, 1);
            assert_eq!(engine.in_kernel(), 0, "the cancelled read is back");
            assert!(!engine.cancel(7), "gone");
            drop(pipe.write);
        },
    );
}

// Built on the loop's thread and kept there: the ring may be shared by the monitor and the
// engine of one loop (`Rc`), and with deferred task work only the thread that set it up may
// enter it (`IORING_SETUP_SINGLE_ISSUER`).
aio_conformance::assert_not_thread_safe!(not_send: UringEngine, aio_backend_uring::UringLoop);

/// A dropped engine future cancels its request in the kernel: a read of an empty pipe (which
/// would wait forever) leaves the engine once the future is gone, with one
/// `IORING_OP_ASYNC_CANCEL` sent, and nothing is ever written to the pipe.
#[test]
fn a_cancel_in_the_kernel_stops_its_own_request_only() {
    if !common::available() {
        return;
    }
    // Two reads of an empty pipe wait in the kernel; the second is cancelled, the first
    // stays until the write end closes.
    let (read_end, write_end) = common::pipe();
    let read_end = IoFile::from(read_end);
    let mut engine = common::engine(UringConfig::default());
    for token in [1, 2] {
        engine.submit(common::pipe_read(&read_end, token)).unwrap();
    }
    assert_eq!(engine.in_kernel(), 2);
    assert!(engine.cancel(2));
    let done = wait_for(&mut engine, 1);
    assert_eq!((done[0].token, done[0].errno()), (2, Some(libc::ECANCELED)));
    assert_eq!(engine.in_kernel(), 1, "the other read still waits");
    drop(write_end);
    let done = wait_for(&mut engine, 1);
    assert_eq!((done[0].token, done[0].result.as_ref().ok()), (1, Some(&0)));
}

#[test]
fn a_dropped_future_cancels_its_read_in_the_kernel() {
    if !common::available() {
        return;
    }
    let ctx = aio_loop::AioContext::new(aio_backend_poll::PollLoop::new()).unwrap();
    let attached = ctx
        .attach_engine(common::engine(UringConfig::default()), |_, _| {})
        .unwrap();
    let (read_end, _write_end) = common::pipe();
    let file = IoFile::from(read_end);
    let read = attached.read(&file, 0, AlignedBuf::new(4096));
    assert_eq!(attached.in_flight(), 1);
    drop(read);
    // A read that was not cancelled never completes (the pipe stays empty): wait for the
    // cancellation's completion, with a hang guard of 5 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while attached.in_flight() > 0 && std::time::Instant::now() < deadline {
        if !ctx.poll(false) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(
        attached.in_flight(),
        0,
        "the cancelled read left the engine"
    );
    assert_eq!(attached.with_engine(|e| e.stats().cancels_sent), 1);
}
