//! The whole conformance suite (aio-conformance) against the ppoll monitor.
aio_conformance::event_loop_conformance!(aio_backend_poll::PollLoop::new());

// A monitor is plain data and an fd: it may be built on one thread and run on another.
aio_conformance::assert_thread_safe!(send_sync: aio_backend_poll::PollLoop);
