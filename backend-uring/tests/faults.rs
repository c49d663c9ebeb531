//! What the engine does when the kernel refuses a call: a submitting enter interrupted, a
//! drop whose wait fails, a buffer registration refused for lack of lockable memory or for
//! that buffer alone. The faults come from seccomp filters on a thread of the test's own
//! (`aio_conformance::seccomp::fail_on_this_thread`), chosen by the call's arguments.

use aio_backend_uring::UringConfig;
use aio_conformance::engine::{read_block, wait_for, TempFile, BLOCK};
use aio_conformance::seccomp::fail_on_this_thread;
use aio_core::engine::{IoEngine, IoFile};

mod common;

/// An enter that fails to submit (`EINTR` here; `EAGAIN` and `EBUSY` alike) leaves its entries
/// in the submission queue, counted as the kernel's: the engine counts the interruption, wakes
/// its loop (with its own ring nothing else would come), and the next enter sends them with
/// whatever joined them. The fault is a seccomp filter on the test's own thread for enters
/// that submit exactly one entry and do not wait.
#[test]
fn an_interrupted_submit_leaves_its_entries_for_the_next_enter_and_wakes_the_loop() {
    if !common::available() {
        return;
    }
    std::thread::spawn(|| {
        // Enters that submit one entry without waiting (flags 0): the drop's wait, should an
        // assertion fail, is not one of them.
        fail_on_this_thread(libc::SYS_io_uring_enter, &[(1, 1), (3, 0)], libc::EINTR).unwrap();
        let mut engine = common::engine(UringConfig::default());
        let (read_end, write_end) = common::pipe();
        let read_end = IoFile::from(read_end);
        engine.notifier().test_and_clear();
        engine.submit(common::pipe_read(&read_end, 0)).unwrap();
        let stats = engine.stats();
        assert_eq!(
            (
                stats.submit_calls,
                stats.entries_submitted,
                stats.interrupted_calls
            ),
            (1, 0, 1),
            "{stats:?}"
        );
        assert_eq!(
            engine.in_kernel(),
            1,
            "the entry waits in the submission queue"
        );
        assert!(
            engine.notifier().test_and_clear(),
            "an engine with its own ring wakes its loop to send it"
        );
        // The next request joins it: one enter of two entries, which goes.
        engine.submit(common::pipe_read(&read_end, 1)).unwrap();
        let stats = engine.stats();
        assert_eq!(
            (
                stats.submit_calls,
                stats.entries_submitted,
                stats.interrupted_calls
            ),
            (2, 2, 1),
            "{stats:?}"
        );
        common::finish(engine, write_end, 2);
    })
    .join()
    .unwrap();
}

/// A drop whose wait for the kernel fails (an enter that waits for one completion refused: a
/// seccomp filter on the test's thread) cannot learn when the kernel is done with the read it
/// holds: the drop returns without retrying forever and leaks the request, whose file (the
/// pipe's read end) stays open, rather than free a buffer the kernel may still write.
#[test]
fn a_drop_whose_wait_fails_returns_and_leaks_the_request() {
    if !common::available() {
        return;
    }
    let (read_end, mut write_end) = common::pipe();
    std::thread::spawn(move || {
        fail_on_this_thread(libc::SYS_io_uring_enter, &[(2, 1)], libc::EINVAL).unwrap();
        let mut engine = common::engine(UringConfig::default());
        let read_end = IoFile::from(read_end);
        engine.submit(common::pipe_read(&read_end, 0)).unwrap();
        drop(read_end);
        drop(engine);
    })
    .join()
    .unwrap();
    // A pipe without a reader refuses writes (EPIPE): this one still has the leaked request's.
    use std::io::Write;
    write_end
        .write_all(b"x")
        .expect("the abandoned request keeps the read end open");
}

/// `io_uring_register`'s buffer-table update (`IORING_REGISTER_BUFFERS_UPDATE`).
const REGISTER_BUFFERS_UPDATE: u32 = 16;

/// Two reads of new buffers by an engine with registered buffers, on a thread whose kernel
/// refuses buffer registrations with `errno`; both reads must succeed. Returns the refusal the
/// engine kept and its `(registrations, refused, requests with a registered buffer)`.
fn two_reads_with_registrations_refused(errno: i32) -> (Option<i32>, (u64, u64, u64)) {
    std::thread::spawn(move || {
        fail_on_this_thread(
            libc::SYS_io_uring_register,
            &[(1, REGISTER_BUFFERS_UPDATE)],
            errno,
        )
        .unwrap();
        let mut engine = common::engine(UringConfig::default().with_fixed_buffers(2));
        assert!(
            engine.fixed_buffers_error().is_none(),
            "the table itself is registered"
        );
        let tmp = TempFile::with_len(2 * BLOCK, 3);
        let file = tmp.open(libc::O_DIRECT).unwrap();
        for block in 0..2 {
            engine.submit(read_block(&file, block, block)).unwrap();
            let done = wait_for(&mut engine, 1);
            assert_eq!(done[0].result.as_ref().ok(), Some(&BLOCK));
        }
        let kept = engine.fixed_buffers_error().and_then(|e| e.raw_os_error());
        let s = engine.stats();
        let counts = (
            s.buffer_registrations,
            s.buffer_registrations_refused,
            s.fixed_buffer_requests,
        );
        (kept, counts)
    })
    .join()
    .unwrap()
}

/// A registration refused for lack of lockable memory (`ENOMEM`) turns registered buffers off
/// for good and says why; the request goes without one, and no later request tries again.
#[test]
fn a_registration_refused_for_memory_turns_registered_buffers_off() {
    if !common::available() {
        return;
    }
    let (kept, counts) = two_reads_with_registrations_refused(libc::ENOMEM);
    assert_eq!(kept, Some(libc::ENOMEM), "the refusal kept");
    assert_eq!(counts, (0, 0, 0), "off after the first refusal");
}

/// A registration refused for that buffer alone (`EFAULT` here) is counted; the request goes
/// without, and registered buffers stay on for the next buffer.
#[test]
fn a_registration_refused_for_one_buffer_leaves_registered_buffers_on() {
    if !common::available() {
        return;
    }
    let (kept, counts) = two_reads_with_registrations_refused(libc::EFAULT);
    assert_eq!(kept, None, "still on");
    assert_eq!(counts, (0, 2, 0), "each new buffer tried and refused");
}
