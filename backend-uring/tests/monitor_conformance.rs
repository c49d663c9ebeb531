//! The whole aio-core event-loop conformance suite against the io_uring fd monitor. Where
//! io_uring is unusable (the `kernel.io_uring_disabled` sysctl, a seccomp filter, the memlock
//! limit) every test says why (`skipped: ...`), and fails under `AIO_REQUIRE_ALL_BACKENDS=1`.
aio_core::event_loop_conformance!(
    probe: aio_backend_uring::probe().map(drop),
    aio_backend_uring::UringLoop::new().expect("io_uring_setup")
);
