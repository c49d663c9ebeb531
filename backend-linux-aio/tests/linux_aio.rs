//! Linux-AIO-specific behaviour: the ring bound, batching, the user-space ring, the buffered
//! policy, io_submit errors, short transfers and the aio-max-nr error.

use aio_backend_linux_aio::{probe, BufferedPolicy, LinuxAio, LinuxAioConfig, LinuxAioError};
use aio_conformance::engine::{read_block, wait_for, TempFile};
use aio_conformance::seccomp::fail_on_this_thread;
use aio_core::engine::{AlignedBuf, IoEngine, Request, RequestError, RwFlags};

use aio_conformance::engine::BLOCK;

fn available() -> bool {
    aio_conformance::available("Linux AIO unavailable", probe()).is_some()
}

#[test]
fn a_tiny_ring_queues_the_rest_and_batches_stay_bounded() {
    if !available() {
        return;
    }
    let mut engine = LinuxAio::new(
        LinuxAioConfig::default()
            .with_ring_size(4)
            .with_max_batch(3),
    )
    .unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 7);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    let mut done = Vec::new();
    for t in 0..1000u64 {
        engine.submit(read_block(&file, t % 64, t)).unwrap();
        assert!(
            engine.in_kernel() <= 4,
            "never more in the kernel than the ring holds"
        );
        if t % 50 == 49 {
            done.extend(wait_for(&mut engine, 1));
        }
    }
    let rest = engine.in_flight();
    done.extend(wait_for(&mut engine, rest));
    assert_eq!(done.len(), 1000);
    assert!(done.iter().all(|c| c.result.as_ref().ok() == Some(&BLOCK)));
    let stats = engine.stats();
    assert_eq!(stats.iocbs_submitted, 1000);
    assert!(
        stats.submit_calls >= 1000 / 3,
        "at most 3 iocbs per io_submit: {stats:?}"
    );
    assert!(
        engine.reads_ring_in_user_space(),
        "this kernel's ring layout is known"
    );
    assert_eq!(
        stats.ring_events, 1000,
        "every completion read from the ring"
    );
    assert_eq!(
        stats.getevents_calls, 0,
        "no io_getevents syscall on the fast path"
    );
}

#[test]
fn the_kernel_holds_what_the_ring_takes_and_a_vector_goes_as_one_iocb() {
    if !available() {
        return;
    }
    let mut engine = LinuxAio::new(LinuxAioConfig::default().with_ring_size(4)).unwrap();
    assert_eq!(
        engine.name(),
        "linux-aio",
        "the name reports and `--engine` use"
    );
    let tmp = TempFile::with_len(64 * BLOCK, 7);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    // Sixteen reads released together: the ring takes four, the queue keeps the rest.
    engine.plug();
    for t in 0..16u64 {
        engine.submit(read_block(&file, t, t)).unwrap();
    }
    engine.unplug();
    assert_eq!(engine.in_kernel(), 4, "a full ring, not more");
    assert_eq!(engine.in_flight(), 16);
    assert_eq!(wait_for(&mut engine, 16).len(), 16);
    assert_eq!(engine.in_kernel(), 0, "every event reaped");
    // One readv of two blocks: one iocb (IOCB_CMD_PREADV), not the first block and then the
    // rest as a remainder.
    let before = engine.stats();
    let bufs = vec![AlignedBuf::new(BLOCK), AlignedBuf::new(BLOCK)];
    engine.submit(Request::readv(&file, 0, bufs, 99)).unwrap();
    let done = wait_for(&mut engine, 1);
    assert_eq!(done[0].result.as_ref().ok(), Some(&(2 * BLOCK)));
    let after = engine.stats();
    assert_eq!(
        after.iocbs_submitted - before.iocbs_submitted,
        1,
        "{after:?}"
    );
    assert_eq!(after.resubmits, before.resubmits, "no remainder went back");
}

/// The engine never has more in the kernel than the ring it asked for, even where the
/// kernel's ring is larger (`io_setup` rounds up) and a round by the batch rule would overshoot:
/// with a ring of 5, rounds of 1, 1, 2 and then only the 1 that fits.
#[test]
fn a_round_takes_only_the_room_left_in_the_ring() {
    if !available() {
        return;
    }
    let mut engine = LinuxAio::new(LinuxAioConfig::default().with_ring_size(5)).unwrap();
    let tmp = TempFile::with_len(16 * BLOCK, 7);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    engine.plug();
    for t in 0..16u64 {
        engine.submit(read_block(&file, t, t)).unwrap();
    }
    engine.unplug();
    assert_eq!(engine.in_kernel(), 5, "{:?}", engine.stats());
    assert_eq!(wait_for(&mut engine, 16).len(), 16);
}

#[test]
fn buffered_files_are_refused_or_accepted_by_policy() {
    if !available() {
        return;
    }
    let tmp = TempFile::with_len(BLOCK, 1);
    let mut strict =
        LinuxAio::new(LinuxAioConfig::default().with_buffered(BufferedPolicy::Refuse)).unwrap();
    let e = strict
        .submit(Request::read(
            &tmp.open(0).unwrap(),
            0,
            AlignedBuf::new(BLOCK),
            1,
        ))
        .unwrap_err();
    assert!(matches!(e.error, RequestError::Unsupported { .. }));
    assert!(e.to_string().contains("O_DIRECT"), "{e}");
    strict
        .submit(Request::read(
            &tmp.open(libc::O_DIRECT).unwrap(),
            0,
            AlignedBuf::new(BLOCK),
            2,
        ))
        .unwrap();
    assert_eq!(strict.drain()[0].result.as_ref().unwrap(), &BLOCK);

    let mut lenient = LinuxAio::new(LinuxAioConfig::default()).unwrap();
    lenient
        .submit(Request::read(
            &tmp.open(0).unwrap(),
            0,
            AlignedBuf::new(BLOCK),
            3,
        ))
        .unwrap();
    assert_eq!(lenient.drain()[0].result.as_ref().unwrap(), &BLOCK);
    assert_eq!(lenient.stats().buffered_requests, 1);
}

#[test]
fn an_io_submit_error_fails_only_the_head_request() {
    if !available() {
        return;
    }
    let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
    let tmp = TempFile::with_len(4 * BLOCK, 2);
    let rw = tmp.open(libc::O_DIRECT).unwrap();
    let ro = tmp.open_read_only();
    // Four reads first (unplugged: one call each), so that the kernel holds 4 and the next
    // four requests go in one batch of 4 (the batch rule), with the bad one second.
    for t in 10..14 {
        engine.submit(read_block(&rw, t % 4, t)).unwrap();
    }
    assert_eq!(engine.stats().submit_calls, 4);
    engine.plug();
    engine
        .submit(Request::read(&rw, 0, AlignedBuf::new(BLOCK), 0))
        .unwrap();
    engine
        .submit(Request::write(&ro, 0, AlignedBuf::new(BLOCK), 1))
        .unwrap();
    engine
        .submit(Request::read(&rw, BLOCK as u64, AlignedBuf::new(BLOCK), 2))
        .unwrap();
    engine.submit(read_block(&rw, 2, 3)).unwrap();
    engine.unplug();
    let mut done = wait_for(&mut engine, 8);
    done.sort_by_key(|c| c.token);
    assert_eq!(done[1].errno(), Some(libc::EBADF));
    for i in [0, 2, 3, 4, 5, 6, 7] {
        assert_eq!(done[i].result.as_ref().unwrap(), &BLOCK);
    }
    let stats = engine.stats();
    assert_eq!(
        stats.submit_errors, 1,
        "io_submit refused the write synchronously"
    );
    // 4 calls for the first four; then the batch of 4 (1 accepted: partial), the retry that
    // fails the head, and one for the last two.
    assert_eq!(stats.submit_calls, 7, "{stats:?}");
}

/// `EAGAIN` from `io_submit` (the kernel short of resources for the batch) holds the batch
/// back, whole and in order, until the kernel has room: no request fails, nothing more is sent
/// while blocked, and a reaped completion lets the next poll send it all. The fault comes from
/// a seccomp filter on the test's own thread, for calls of exactly three iocbs.
#[test]
fn an_io_submit_eagain_holds_the_batch_back_until_a_completion_frees_room() {
    if !available() {
        return;
    }
    std::thread::spawn(|| {
        fail_on_this_thread(libc::SYS_io_submit, &[(1, 3)], libc::EAGAIN).unwrap();
        let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
        let tmp = TempFile::with_len(8 * BLOCK, 7);
        let file = tmp.open(libc::O_DIRECT).unwrap();
        // Three reads one by one (one iocb each): in the kernel until reaped, so that the batch
        // rule lets the next three go as one call.
        for t in 0..3 {
            engine.submit(read_block(&file, t, t)).unwrap();
        }
        assert_eq!(engine.in_kernel(), 3);
        engine.plug();
        for t in 3..6 {
            engine.submit(read_block(&file, t, t)).unwrap();
        }
        engine.unplug();
        let blocked = engine.stats();
        assert_eq!(
            (blocked.submit_eagain, blocked.interrupted_calls),
            (1, 0),
            "{blocked:?}"
        );
        assert_eq!(blocked.submit_errors, 0, "no request failed for it");
        assert_eq!((engine.in_kernel(), engine.in_flight()), (3, 6));
        // Blocked: a request submitted now waits behind the three without an io_submit.
        engine.submit(read_block(&file, 6, 6)).unwrap();
        assert_eq!(
            engine.stats().submit_calls,
            blocked.submit_calls,
            "no io_submit while blocked with requests in the kernel"
        );
        // The first reads' completions free room: the polls send the rest.
        let mut done = wait_for(&mut engine, 7);
        done.sort_by_key(|c| c.token);
        let tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
        assert_eq!(tokens, [0, 1, 2, 3, 4, 5, 6]);
        for c in &done {
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK), "token {}", c.token);
        }
        let after = engine.stats();
        assert_eq!(after.submit_eagain, 1, "{after:?}");
        assert_eq!(
            after.iocbs_submitted, 7,
            "each request sent once: {after:?}"
        );
    })
    .join()
    .unwrap();
}

/// `EAGAIN` or `EINTR` from `io_submit` with nothing in the kernel (no completion will come to
/// retry on): the engine wakes its own notifier so that the loop polls again, that poll tries
/// again, and each refusal is counted as what it was. The faults are seccomp filters on two
/// threads of the test's (calls of one iocb get `EAGAIN` on the first, `EINTR` on the second);
/// the engine moves between them and then to a thread without a filter, where the read goes.
#[test]
fn an_io_submit_refused_with_nothing_in_the_kernel_wakes_the_loop_to_retry() {
    if !available() {
        return;
    }
    let tmp = TempFile::with_len(4 * BLOCK, 7);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
    engine.submit(read_block(&file, 0, 0)).unwrap();
    assert_eq!(wait_for(&mut engine, 1).len(), 1);
    let counts = |engine: &LinuxAio| {
        let s = engine.stats();
        (s.submit_eagain, s.interrupted_calls, s.submit_errors)
    };
    let mut engine = std::thread::spawn(move || {
        fail_on_this_thread(libc::SYS_io_submit, &[(1, 1)], libc::EAGAIN).unwrap();
        engine.notifier().test_and_clear();
        engine.submit(read_block(&file, 1, 1)).unwrap();
        assert_eq!(counts(&engine), (1, 0, 0), "{:?}", engine.stats());
        assert!(
            engine.notifier().test_and_clear(),
            "EAGAIN with nothing in the kernel wakes the loop"
        );
        // The poll that wakes up tries again (and is refused again).
        let mut out = std::collections::VecDeque::new();
        assert_eq!(engine.poll_completions(&mut out), 0);
        assert_eq!(counts(&engine), (2, 0, 0), "the poll retried");
        assert!(engine.notifier().test_and_clear());
        engine
    })
    .join()
    .unwrap();
    engine = std::thread::spawn(move || {
        fail_on_this_thread(libc::SYS_io_submit, &[(1, 1)], libc::EINTR).unwrap();
        let mut out = std::collections::VecDeque::new();
        assert_eq!(engine.poll_completions(&mut out), 0);
        assert_eq!(counts(&engine), (2, 1, 0), "{:?}", engine.stats());
        assert!(
            engine.notifier().test_and_clear(),
            "EINTR with nothing in the kernel wakes the loop"
        );
        engine
    })
    .join()
    .unwrap();
    let done = wait_for(&mut engine, 1);
    assert_eq!(
        (done[0].token, done[0].result.as_ref().ok()),
        (1, Some(&BLOCK))
    );
    assert_eq!(engine.stats().iocbs_submitted, 2, "{:?}", engine.stats());
}

/// A drop whose wait for the kernel fails (`io_getevents` refused: a seccomp filter on the
/// test's thread for calls that wait for one event) cannot learn when the kernel is done with
/// the request it holds: the drop returns without retrying forever and leaks the request (its
/// file stays open) rather than free what the kernel may still write.
#[test]
fn a_drop_whose_wait_fails_returns_and_leaks_the_request() {
    if !available() {
        return;
    }
    let tmp = TempFile::with_len(BLOCK, 7);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    let fd = file.raw_fd();
    std::thread::spawn(move || {
        fail_on_this_thread(libc::SYS_io_getevents, &[(1, 1)], libc::EINVAL).unwrap();
        let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
        engine.submit(read_block(&file, 0, 0)).unwrap();
        drop(file);
        assert_eq!(engine.in_kernel(), 1, "not reaped: the drop waits for it");
        drop(engine);
    })
    .join()
    .unwrap();
    // SAFETY: F_GETFD only reads the fd's flags; `fd` may be closed, which it reports.
    let open = unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
    assert!(open, "the abandoned request keeps its file open");
}

#[test]
fn a_read_across_eof_is_resubmitted_for_the_remainder() {
    if !available() {
        return;
    }
    let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
    let tmp = TempFile::with_len(3 * BLOCK, 9);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    engine
        .submit(Request::readv(
            &file,
            BLOCK as u64,
            vec![AlignedBuf::new(BLOCK), AlignedBuf::new(4 * BLOCK)],
            1,
        ))
        .unwrap();
    let done = engine.drain();
    assert_eq!(done[0].result.as_ref().unwrap(), &(2 * BLOCK));
    assert!(
        engine.stats().resubmits >= 1,
        "the short read went back for the rest"
    );
}

#[test]
fn exhausting_aio_max_nr_is_a_typed_error_naming_the_limit() {
    if !available() {
        return;
    }
    let max: u64 = std::fs::read_to_string("/proc/sys/fs/aio-max-nr")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65536);
    // The kernel refuses more than 2^28 / 32 events with EINVAL before it checks the limit.
    if max >= (1 << 23) - 1 {
        aio_conformance::skip(&format!(
            "aio-max-nr is {max}: too large to exhaust from a test"
        ));
        return;
    }
    let e = LinuxAio::new(LinuxAioConfig::default().with_ring_size((max + 1) as u32)).unwrap_err();
    assert!(matches!(e, LinuxAioError::AioMaxNr { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("/proc/sys/fs/aio-max-nr") && msg.contains(&max.to_string()),
        "{msg}"
    );
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::WouldBlock);
    for (config, field) in [
        (LinuxAioConfig::default().with_ring_size(0), "ring_size"),
        (LinuxAioConfig::default().with_max_batch(0), "max_batch"),
    ] {
        match LinuxAio::new(config) {
            Err(LinuxAioError::BadConfig(bad)) => {
                assert_eq!((bad.config, bad.field), ("LinuxAioConfig", field))
            }
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn discard_is_refused_as_unsupported_and_fua_writes_are_counted() {
    if !available() {
        return;
    }
    let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
    let tmp = TempFile::with_len(4 * BLOCK, 0);
    let file = tmp.open(libc::O_DIRECT).unwrap();
    for r in [
        Request::discard(&file, 0, BLOCK as u64, 1),
        Request::write_zeroes(&file, 0, BLOCK as u64, true, 2),
    ] {
        let e = engine.submit(r).unwrap_err();
        assert!(
            matches!(e.error, RequestError::Unsupported { .. }),
            "{}",
            e.error
        );
        assert_eq!(
            std::io::Error::from(e).kind(),
            std::io::ErrorKind::Unsupported
        );
    }
    let write = Request::write(&file, 0, AlignedBuf::from_slice(&[9; BLOCK]), 3);
    engine.submit(write.with_flags(RwFlags::FUA)).unwrap();
    engine.submit(read_block(&file, 1, 4)).unwrap();
    let done = wait_for(&mut engine, 2);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(
        engine.stats().fua_writes,
        1,
        "one FUA write of two requests"
    );
    assert_eq!(tmp.contents()[..BLOCK], [9; BLOCK]);
}

// Moves to the thread that runs it; used by one thread at a time.
aio_conformance::assert_thread_safe!(send: LinuxAio);
aio_conformance::assert_not_thread_safe!(not_sync: LinuxAio);

#[test]
fn signals_interrupt_the_engines_waits_and_are_retried() {
    if !available() {
        return;
    }
    aio_conformance::run_test(
        "signals_interrupt_the_engines_waits_and_are_retried",
        || {
            let tmp = TempFile::with_len(64 * BLOCK, 7);
            // tmpfs completes O_DIRECT inside io_submit: no wait would be left to interrupt.
            // SAFETY: a zeroed statfs is a valid out-buffer; the path is NUL-terminated.
            let f_type = unsafe {
                let mut st: libc::statfs = std::mem::zeroed();
                let path =
                    std::ffi::CString::new(tmp.path().as_os_str().as_encoded_bytes()).unwrap();
                assert_eq!(libc::statfs(path.as_ptr(), &mut st), 0);
                st.f_type
            };
            if f_type == libc::TMPFS_MAGIC {
                aio_conformance::skip_test("the temp dir is tmpfs, whose O_DIRECT never waits");
            }
            let file = tmp
                .open(libc::O_DIRECT)
                .unwrap_or_else(|e| aio_conformance::skip_test(format!("O_DIRECT: {e}")));
            let mut engine = LinuxAio::new(LinuxAioConfig::default()).unwrap();
            // Whether a signal finds the engine inside io_getevents depends on how the storm's
            // thread is scheduled: storms go on until one has, for up to a minute.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut sent = 0;
            while engine.stats().interrupted_calls == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{sent} signals in a minute, none interrupted a call: {:?}",
                    engine.stats()
                );
                sent +=
                    aio_conformance::interruptions::read_through_a_signal_storm(&mut engine, &file);
            }
        },
    );
}
