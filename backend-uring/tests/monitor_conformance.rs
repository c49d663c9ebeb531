//! The whole aio-core event-loop conformance suite against the io_uring fd monitor. Where
//! io_uring is unusable (the `kernel.io_uring_disabled` sysctl, a seccomp filter, the memlock
//! limit) every test says why (`skipped: ...`), and fails under `AIO_REQUIRE_ALL_BACKENDS=1`.
mod common;

aio_conformance::event_loop_conformance!(
    probe: aio_backend_uring::probe().map(drop),
    crate::common::monitor()
);

/// Where io_uring is refused (a container runtime's seccomp profile), this whole suite says
/// `skipped:` with the reason and passes, without `AIO_REQUIRE_ALL_BACKENDS`: this test binary
/// again, in a child whose seccomp filter refuses `io_uring_setup`.
#[test]
fn refused_kernel_makes_every_test_skip_not_panic() {
    let text = aio_conformance::seccomp::suite_passes_refusing(
        &[libc::SYS_io_uring_setup],
        "refused_kernel",
        20,
    );
    // The reason named: the filter's EPERM, or the sysctl where it already refuses io_uring.
    assert!(
        text.contains("EPERM") || text.contains("seccomp") || text.contains("io_uring_disabled"),
        "{text}"
    );
}
