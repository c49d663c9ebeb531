//! The whole aio-core conformance suite against the epoll monitor.
aio_core::event_loop_conformance!(aio_backend_epoll::EpollLoop::new().expect("epoll_create1"));
