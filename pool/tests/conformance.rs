//! The whole aio-core engine conformance suite against the thread pool.
aio_core::engine_conformance!(
    aio_pool::ThreadPool::new(aio_pool::PoolConfig::default()).expect("pool"),
    aio_backend_poll::PollLoop::new()
);
