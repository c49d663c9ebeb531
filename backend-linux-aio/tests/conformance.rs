//! The whole aio-core engine conformance suite against the Linux AIO engine.
aio_core::engine_conformance!(
    probe: aio_backend_linux_aio::probe(),
    aio_backend_linux_aio::LinuxAio::new(Default::default()).expect("io_setup"),
    aio_backend_poll::PollLoop::new()
);
