//! The whole aio-core event-loop conformance suite against the io_uring fd monitor.
//! (The event-loop macro has no probe: on a kernel without io_uring, `UringLoop::new` fails and
//! names the reason.)
aio_core::event_loop_conformance!(aio_backend_uring::UringLoop::new().expect("io_uring unusable"));
