//! One ring for the fd monitor and the engine: the whole engine conformance suite, run with a
//! monitor and an engine built together by `shared_ring` (block I/O completions arrive with
//! the monitor's, without an eventfd).

use std::cell::RefCell;
use std::rc::Rc;

use aio_backend_uring::{probe, UringConfig, UringEngine, UringLoop};

mod common;

/// Builds a pair on whichever half the suite asks for first, and a new pair whenever the half
/// asked for was already given out (tests that build an engine or a context per round; the
/// engine-only tests never ask for the monitor).
fn pair() -> Option<(impl Fn() -> UringEngine, impl Fn() -> UringLoop)> {
    aio_core::testing::available("io_uring unusable", probe())?;
    type Halves = (Option<UringLoop>, Option<UringEngine>);
    let halves: Rc<RefCell<Option<Halves>>> = Rc::default();
    let build = |halves: &Rc<RefCell<Option<Halves>>>, want_engine: bool| {
        let mut h = halves.borrow_mut();
        let gone = match h.as_ref() {
            None => true,
            Some((m, e)) => (want_engine && e.is_none()) || (!want_engine && m.is_none()),
        };
        if gone {
            let (monitor, engine) = common::shared(UringConfig::default());
            assert!(monitor.is_shared() && engine.is_shared());
            *h = Some((Some(monitor), Some(engine)));
        }
    };
    let (h1, h2) = (halves.clone(), halves);
    let engine = move || {
        build(&h1, true);
        let engine = h1.borrow_mut().as_mut().and_then(|(_, e)| e.take());
        engine.expect("one engine per pair")
    };
    let monitor = move || {
        build(&h2, false);
        let monitor = h2.borrow_mut().as_mut().and_then(|(m, _)| m.take());
        monitor.expect("one monitor per pair")
    };
    Some((engine, monitor))
}

/// One `#[test]` per suite test, each on a fresh shared-ring pair.
macro_rules! on_shared_ring {
    ($module:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Some((engine, monitor)) = pair() {
                    aio_core::testing::run_test(stringify!($name), || {
                        aio_core::testing::$module::$name(engine, monitor)
                    });
                }
            }
        )*
    };
}

// The whole engine suite, but for two tests that do not apply: the iothread test builds its
// engine on another thread, which a shared ring, built with its monitor on this one, cannot
// be; and a shared ring's engine never writes its notifier (the monitor reports the engine's
// completions from the one completion queue), which `notifier_signals_every_completion_batch`
// checks for.
mod engine_suite {
    use super::pair;
    on_shared_ring!(engine:
        write_then_read_at_random_offsets,
        readv_and_writev,
        fsync_and_fdatasync,
        o_direct_with_aligned_buffers,
        short_read_at_eof_and_read_past_eof,
        errors_are_per_request_and_the_batch_completes,
        ten_thousand_requests_complete_exactly_once,
        cancel_of_a_queued_request_ends_with_ecanceled,
        plug_releases_a_full_batch,
        drain_hands_every_buffer_back,
    );
    on_shared_ring!(interruptions:
        drop_with_requests_in_flight_waits_for_them,
        signals_during_io_are_retried_not_reported,
    );
}

mod engine_loop_suite {
    use super::pair;
    on_shared_ring!(engine_loop:
        qd1_through_the_loop_without_polling,
        bad_input_is_refused_with_the_request_handed_back,
        attached_engine_delivers_in_the_loop,
        nested_poll_in_a_completion_callback_loses_and_duplicates_nothing,
        callback_that_submits_and_waits_in_a_nested_loop_is_not_stuck_in_a_batch,
        injected_faults_are_reported_against_their_own_requests,
        context_dropped_with_thousands_in_flight,
        completion_callbacks_defer_calls_to_the_end_of_their_batch,
    );
}

mod disk_suite {
    use super::pair;
    on_shared_ring!(disk:
        discard_and_write_zeroes_read_back_as_zeroes,
        discard_refused_by_the_file_system_is_a_typed_error,
        guest_memory_reads_and_writes_at_many_offsets,
        misaligned_guest_iovec_is_refused_at_submit,
        fua_and_nowait_requests_complete,
        per_request_callbacks_submit_from_inside,
        writes_on_a_full_file_system_fail_alone,
    );
}

mod block_device_suite {
    use super::pair;
    on_shared_ring!(block_device:
        block_device_takes_discard_and_write_zeroes,
        block_device_reads_and_writes_at_random_offsets,
    );
}

mod async_suite {
    use super::pair;
    on_shared_ring!(async_engine:
        async_requests_complete_exactly_once_at_qd32,
        dropped_futures_free_nothing_early_and_leak_nothing,
        block_on_inside_a_completion_callback,
        cancel_after_submit_completes_each_once,
    );
}
