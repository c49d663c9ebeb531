//! The whole aio-core conformance suite against the ppoll monitor.
aio_core::event_loop_conformance!(aio_backend_poll::PollLoop::new());
