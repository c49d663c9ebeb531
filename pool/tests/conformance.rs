//! The whole engine conformance suite (aio-conformance) against the thread pool.
aio_conformance::engine_conformance!(
    aio_pool::ThreadPool::new(aio_pool::PoolConfig::default()).expect("pool"),
    aio_backend_poll::PollLoop::new()
);

/// The suite once more with the loop on epoll (the tests that attach the engine to a context).
mod on_epoll {
    aio_conformance::engine_conformance!(
        aio_pool::ThreadPool::new(Default::default()).expect("pool"),
        aio_backend_epoll::EpollLoop::new().expect("epoll")
    );
}
