//! The whole conformance suite (aio-conformance) against the hybrid monitor (ppoll below the threshold,
//! epoll from it up), at QEMU's threshold of 64 and at a threshold of 2 that makes every test
//! switch monitors while it runs.

mod threshold_64 {
    aio_conformance::event_loop_conformance!(aio::Hybrid::new(
        aio_backend_poll::PollLoop::new(),
        aio_backend_epoll::EpollLoop::new().expect("epoll_create1"),
    ));
}

mod threshold_2 {
    aio_conformance::event_loop_conformance!(aio::Hybrid::with_threshold(
        aio_backend_poll::PollLoop::new(),
        aio_backend_epoll::EpollLoop::new().expect("epoll_create1"),
        2,
    ));
}
