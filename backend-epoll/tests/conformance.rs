//! The whole conformance suite (aio-conformance) against the epoll monitor, and once more where the
//! kernel refuses `epoll_pwait2` (millisecond waits).

use std::time::Duration;

use aio_backend_epoll::EpollLoop;
use aio_core::EventLoop;

aio_conformance::event_loop_conformance!(
    aio_backend_epoll::EpollLoop::new().expect("epoll_create1")
);

// A monitor is plain data and an fd: it may be built on one thread and run on another.
aio_conformance::assert_thread_safe!(send_sync: aio_backend_epoll::EpollLoop);

/// Whether this kernel (and seccomp profile) runs `epoll_pwait2`: asked directly, with a bad
/// fd (EBADF when it exists; ENOSYS or the filter's EPERM when not).
fn kernel_has_pwait2() -> bool {
    // SAFETY: epoll_pwait2 on fd -1 touches no memory; it fails before reading any argument.
    let r = unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait2,
            -1,
            std::ptr::null_mut::<libc::epoll_event>(),
            1,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<libc::sigset_t>(),
            0usize,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error();
    !(r < 0 && matches!(errno, Some(libc::ENOSYS) | Some(libc::EPERM)))
}

/// A timed wait uses `epoll_pwait2` (ns timeouts) exactly where the kernel runs it, and
/// otherwise `epoll_wait` with the timeout rounded up to whole milliseconds, never ending early.
#[test]
fn timed_waits_use_epoll_pwait2_exactly_where_the_kernel_runs_it() {
    let mut monitor = EpollLoop::new().unwrap();
    let mut events = Vec::new();
    for timeout in [Duration::from_micros(300), Duration::from_millis(2)] {
        let start = std::time::Instant::now();
        monitor.wait(Some(timeout), &mut events).unwrap();
        assert!(start.elapsed() >= timeout, "{timeout:?} ended early");
    }
    assert_eq!(monitor.has_pwait2(), kernel_has_pwait2());
    if !monitor.has_pwait2() {
        println!("epoll_pwait2 refused: waits in whole milliseconds");
    }
}

/// The whole epoll suite passes where `epoll_pwait2` is refused (a kernel before 5.11, or a
/// seccomp profile that predates it): this test binary again, in a child whose seccomp filter
/// refuses it with EPERM, on millisecond waits.
#[test]
fn without_epoll_pwait2_every_test_passes_on_millisecond_waits() {
    let text = aio_conformance::seccomp::suite_passes_refusing(
        &[libc::SYS_epoll_pwait2],
        "without_epoll_pwait2",
        0,
    );
    assert!(text.contains("waits in whole milliseconds"), "{text}");
}
