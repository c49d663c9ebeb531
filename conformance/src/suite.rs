//! [`engine_conformance!`](crate::engine_conformance): which conformance tests run against an
//! engine, on files and on loop devices, and how each builds its engine and monitor.
//!
//! This module owns the macro and its lists of tests, never a test (those are in `engine`,
//! `disk`, `block_device`, `async_engine`, `interruptions`, `engine_loop` and `iothread`).

/// Generates one `#[test]` per engine conformance test; `$engine` builds the engine and
/// `$monitor` the fd monitor for tests that run a loop. With `probe: $probe` (an expression
/// giving `Result<(), impl Display>`), each test first asks whether the kernel supports the
/// engine and, if not, reports `skipped: <reason>` (a failure under
/// `AIO_REQUIRE_ALL_BACKENDS=1`).
///
/// With `pair: $pair`, for an engine and a monitor built together (io_uring's shared ring),
/// `$pair` is an expression giving `Option<(impl Fn() -> E, impl Fn() -> L)>` (`None`: skipped,
/// said by the expression). It runs the suite but for the tests an engine that shares its
/// monitor cannot take: one that builds the engine on an iothread, and one that checks the
/// engine's own notifier.
#[macro_export]
macro_rules! engine_conformance {
    // One `#[test]` per name; `$how` says how each builds its engine and monitor.
    (@tests $how:tt; $module:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::engine_conformance!(@run $how; $module::$name);
            }
        )*
    };
    (@run (files $probe:expr, $engine:expr, $monitor:expr); $module:ident::$name:ident) => {
        if $crate::available(::std::stringify!($name), $probe).is_none() {
            return;
        }
        $crate::run_test(::std::stringify!($name), || {
            $crate::$module::$name(|| $engine, || $monitor)
        });
    };
    (@run (loop_devices $probe:expr, $engine:expr, $monitor:expr); $module:ident::$name:ident) => {
        if $crate::available(::std::stringify!($name), $probe).is_none() {
            return;
        }
        $crate::engine_conformance!(@on_loop_devices $name, || {
            $crate::$module::$name(|| $engine, || $monitor)
        });
    };
    (@run (pair_files $pair:expr); $module:ident::$name:ident) => {
        if let ::std::option::Option::Some((engine, monitor)) = $pair {
            $crate::run_test(::std::stringify!($name), || {
                $crate::$module::$name(engine, monitor)
            });
        }
    };
    (@run (pair_loop_devices $pair:expr); $module:ident::$name:ident) => {
        if let ::std::option::Option::Some((engine, monitor)) = $pair {
            $crate::engine_conformance!(@on_loop_devices $name, || {
                $crate::$module::$name(engine, monitor)
            });
        }
    };
    // Runs `$test` with every file it makes a loop device, and fails if it made none (it would
    // have run on plain files).
    (@on_loop_devices $name:ident, $test:expr) => {
        let ::std::option::Option::Some(devices) =
            $crate::fixtures::on_loop_devices(::std::stringify!($name))
        else {
            return;
        };
        $crate::run_test(::std::stringify!($name), $test);
        ::std::assert!(
            devices.devices_made() > 0,
            "{} ran on no loop device (its files were plain files)",
            ::std::stringify!($name)
        );
    };
    // The tests that run on files and on loop devices alike, but for `@own_notifier`'s.
    (@anywhere $how:tt) => {
        $crate::engine_conformance!(@tests $how; lent:
            guest_memory_reads_and_writes_at_many_offsets,
            misaligned_guest_iovec_is_refused_at_submit,
            lent_memory_is_held_until_its_completion_hands_it_back,
        );
        $crate::engine_conformance!(@tests $how; disk:
            fua_and_nowait_requests_complete,
            per_request_callbacks_submit_from_inside,
        );
        $crate::engine_conformance!(@tests $how; async_engine:
            async_requests_complete_exactly_once_at_qd32,
            dropped_futures_free_nothing_early_and_leak_nothing,
            block_on_inside_a_completion_callback,
            cancel_after_submit_completes_each_once,
        );
        $crate::engine_conformance!(@tests $how; engine:
            write_then_read_at_random_offsets,
            readv_and_writev,
            fsync_and_fdatasync,
            o_direct_with_aligned_buffers,
            errors_are_per_request_and_the_batch_completes,
            ten_thousand_requests_complete_exactly_once,
            cancel_of_a_queued_request_ends_with_ecanceled,
            plug_releases_a_full_batch,
            drain_hands_every_buffer_back,
        );
        $crate::engine_conformance!(@tests $how; interruptions:
            drop_with_requests_in_flight_waits_for_them,
            signals_during_io_are_retried_not_reported,
        );
        $crate::engine_conformance!(@tests $how; engine_loop:
            qd1_through_the_loop_without_polling,
            qd1_with_the_automatic_window_polls_for_the_completions,
            bad_input_is_refused_with_the_request_handed_back,
            attached_engine_delivers_in_the_loop,
            nested_poll_in_a_completion_callback_loses_and_duplicates_nothing,
            callback_that_submits_and_waits_in_a_nested_loop_is_not_stuck_in_a_batch,
            injected_faults_are_reported_against_their_own_requests,
            context_dropped_with_thousands_in_flight,
            completion_callbacks_defer_calls_to_the_end_of_their_batch,
        );
    };
    // On files in the temp dir only: a file system's behaviour (sizes, holes, a full or
    // refusing file system), EOF inside a block, and the tests that make their own loop device.
    (@on_files $how:tt) => {
        $crate::engine_conformance!(@anywhere $how);
        $crate::engine_conformance!(@tests $how; disk:
            discard_and_write_zeroes_read_back_as_zeroes,
            discard_refused_by_the_file_system_is_a_typed_error,
            writes_on_a_full_file_system_fail_alone,
        );
        $crate::engine_conformance!(@tests $how; block_device:
            block_device_takes_discard_and_write_zeroes,
            block_device_reads_and_writes_at_random_offsets,
        );
        $crate::engine_conformance!(@tests $how; engine:
            short_read_at_eof_and_read_past_eof,
        );
    };
    // On loop devices only: writes the block layer holds.
    (@on_block_devices $how:tt) => {
        $crate::engine_conformance!(@anywhere $how);
        $crate::engine_conformance!(@tests $how; interruptions:
            drop_waits_for_writes_the_block_layer_holds,
        );
    };
    // The tests of an engine with a notifier of its own, built apart from the monitor.
    (@own_notifier $how:tt) => {
        $crate::engine_conformance!(@tests $how; iothread:
            engine_runs_inside_an_iothread,
        );
        $crate::engine_conformance!(@tests $how; engine_loop:
            notifier_signals_every_completion_batch,
        );
    };
    (probe: $probe:expr, $engine:expr, $monitor:expr) => {
        $crate::engine_conformance!(@on_files (files $probe, $engine, $monitor));
        $crate::engine_conformance!(@own_notifier (files $probe, $engine, $monitor));
        /// The suite once more, every file a loop device (`losetup --direct-io=on`): a real
        /// block device under each engine.
        mod on_a_loop_device {
            #[allow(unused_imports)]
            use super::*;
            $crate::engine_conformance!(@on_block_devices (loop_devices $probe, $engine, $monitor));
            $crate::engine_conformance!(@own_notifier (loop_devices $probe, $engine, $monitor));
        }
    };
    (pair: $pair:expr) => {
        $crate::engine_conformance!(@on_files (pair_files $pair));
        /// The suite once more, every file a loop device (`losetup --direct-io=on`).
        mod on_a_loop_device {
            #[allow(unused_imports)]
            use super::*;
            $crate::engine_conformance!(@on_block_devices (pair_loop_devices $pair));
        }
    };
    ($engine:expr, $monitor:expr) => {
        $crate::engine_conformance!(probe: ::std::result::Result::<(), &str>::Ok(()), $engine, $monitor);
    };
}
