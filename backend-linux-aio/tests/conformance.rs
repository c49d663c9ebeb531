//! The whole engine conformance suite (aio-conformance) against the Linux AIO engine, alone and behind
//! `WithFallback` with a thread pool.
aio_conformance::engine_conformance!(
    probe: aio_backend_linux_aio::probe(),
    aio_backend_linux_aio::LinuxAio::new(Default::default()).expect("io_setup"),
    aio_backend_poll::PollLoop::new()
);

/// The suite once more behind `WithFallback` with a thread pool, the way a user of Linux AIO gets
/// discard and write-zeroes (the kernel's AIO has no `fallocate`).
mod routed_to_a_pool {
    aio_conformance::engine_conformance!(
        probe: aio_backend_linux_aio::probe(),
        aio_core::engine::WithFallback::new(
            aio_backend_linux_aio::LinuxAio::new(Default::default()).expect("io_setup"),
            aio_pool::ThreadPool::new(Default::default()).expect("pool"),
        ),
        aio_backend_poll::PollLoop::new()
    );
}

/// The suite once more with the loop on the hybrid monitor (ppoll below 64 fds, epoll above).
mod on_hybrid {
    aio_conformance::engine_conformance!(
        probe: aio_backend_linux_aio::probe(),
        aio_backend_linux_aio::LinuxAio::new(Default::default()).expect("io_setup"),
        aio::Hybrid::new(
            aio_backend_poll::PollLoop::new(),
            aio_backend_epoll::EpollLoop::new().expect("epoll"),
        )
    );
}

/// Where Linux AIO is refused (a seccomp profile; `aio-max-nr` used up takes the same path),
/// the whole suite says `skipped:` with the reason and passes, without
/// `AIO_REQUIRE_ALL_BACKENDS`: this test binary again, in a child whose seccomp filter refuses
/// `io_setup`.
#[test]
fn refused_kernel_makes_every_test_skip_not_panic() {
    let text = aio_conformance::seccomp::suite_passes_refusing(
        &[libc::SYS_io_setup],
        "refused_kernel",
        40,
    );
    drop(text);
}
