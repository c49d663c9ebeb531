//! The whole aio-core conformance suites against io_uring: the engine suite against
//! `UringEngine` (default, with registered files, with registered buffers in a table smaller
//! than the requests in flight, in each task-work mode), the event-loop suite against
//! `UringLoop`.
//! Where io_uring is unusable every test says why (`skipped: ...`), and fails under
//! `AIO_REQUIRE_ALL_BACKENDS=1`.

mod common;

mod engine {
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        crate::common::engine(Default::default()),
        aio_backend_poll::PollLoop::new()
    );
}

mod engine_registered_files {
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        crate::common::engine(aio_backend_uring::UringConfig::default().with_register_files(true)),
        aio_backend_poll::PollLoop::new()
    );
}

mod engine_fixed_buffers {
    // 8 slots: the suites keep more buffers than that in flight, so registration, reuse,
    // replacement of idle slots and requests going without a slot all happen.
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        crate::common::engine(aio_backend_uring::UringConfig::default().with_fixed_buffers(8).with_register_files(true)),
        aio_backend_poll::PollLoop::new()
    );
}

// The default (`TaskRun::Auto`) is deferred task work on this project's kernels; the other two
// modes post completions differently (an interrupt, a flag the `io_poll` check reads).
mod engine_task_run_signal {
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        crate::common::engine(aio_backend_uring::UringConfig::default().with_task_run(aio_backend_uring::TaskRun::Signal)),
        aio_backend_poll::PollLoop::new()
    );
}

mod engine_task_run_cooperative {
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        crate::common::engine(aio_backend_uring::UringConfig::default().with_task_run(aio_backend_uring::TaskRun::Cooperative)),
        aio_backend_poll::PollLoop::new()
    );
}

mod engine_on_uring_monitor {
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        crate::common::engine(Default::default()),
        crate::common::monitor()
    );
}

// Behind `WithFallback` with a thread pool: a block device's discard (an ioctl) goes to the pool.
mod engine_routed_to_a_pool {
    aio_conformance::engine_conformance!(
        probe: aio_backend_uring::probe().map(drop),
        aio_core::engine::WithFallback::new(
            crate::common::engine(Default::default()),
            aio_pool::ThreadPool::new(Default::default()).expect("pool"),
        ),
        aio_backend_poll::PollLoop::new()
    );
}
