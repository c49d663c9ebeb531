//! # aio-conformance
//!
//! The conformance suite of aio-rs: every behavioural test of the [`EventLoop`],
//! [`IoEngine`](aio_core::IoEngine) and [`AioContext`] contracts, run by each backend crate
//! against itself. A backend takes this crate as a dev-dependency only.
//!
//! This crate owns the tests and their fixtures (pipes, temp files, loop devices, a watchdog
//! timer, fault-injecting engines), never a contract (`aio-core`) or the loop (`aio-loop`). A
//! backend gets the whole suite with one line in `tests/conformance.rs`:
//!
//! ```ignore
//! // a monitor
//! aio_conformance::event_loop_conformance!(my_backend::MyLoop::new().unwrap());
//! // an engine, with the monitors it is tried on
//! aio_conformance::engine_conformance!(my_backend::MyEngine::new().unwrap());
//! ```
//!
//! A test that needs a kernel feature probes it; where it is missing it prints
//! `skipped: <reason>`, and with `AIO_REQUIRE_ALL_BACKENDS=1` a skip is a failure
//! ([`skip`], [`available`]).
//!
//! The expression is evaluated once per test (and more often where a test needs several
//! contexts). Tests that block arm a watchdog timer, so a broken backend fails instead of
//! hanging.

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use aio_core::EventLoop;
use aio_loop::AioContext;

pub use aio_loop::FakeClock;

pub mod async_engine;
pub mod block_device;
pub mod contract;
pub mod disk;
pub mod engine;
pub mod engine_loop;
pub mod event_loop;
pub mod event_loop_wait;
pub mod faults;
pub mod fixtures;
pub mod interruptions;
pub mod iothread;
pub mod leftovers;
pub mod lent;
pub mod seccomp;
pub mod send_sync;
mod suite;
pub mod tasks;
pub mod throttle;

/// `AlignedBuf`s allocated minus those freed on this thread so far: a test that allocates
/// and frees on one thread (the loop's) compares it before and after to see that nothing
/// leaked, and in between that nothing was freed early.
pub fn live_buffers() -> isize {
    aio_core::kit::live_buffers()
}

/// Whether `AIO_REQUIRE_ALL_BACKENDS=1` is set: a test that would skip for a missing kernel
/// feature fails instead.
pub fn require_all_backends() -> bool {
    std::env::var("AIO_REQUIRE_ALL_BACKENDS").is_ok_and(|v| v == "1")
}

/// A probe's answer for a test: `Some` when the feature is there; otherwise reports the skip
/// (see [`skip`]) with `what` and the probe's reason, and gives `None`.
pub fn available<T, E: std::fmt::Display>(what: &str, probe: Result<T, E>) -> Option<T> {
    match probe {
        Ok(v) => Some(v),
        Err(reason) => {
            skip(&format!("{what}: {reason}"));
            None
        }
    }
}

/// Waits (at most `within`) until thread `tid` of this process sleeps in the kernel: state `S`
/// in `/proc/self/task/TID/stat`, which a loop thread is only in once its wait has blocked.
pub fn wait_until_sleeping(tid: libc::pid_t, within: std::time::Duration) -> bool {
    let path = format!("/proc/self/task/{tid}/stat");
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        let state = std::fs::read_to_string(&path).ok().and_then(|stat| {
            // The command name (field 2) is in parentheses and may hold spaces.
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        });
        if state == Some('S') {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// Reports a skipped test: prints `skipped: <reason>`, or panics when
/// `AIO_REQUIRE_ALL_BACKENDS=1` says nothing may be skipped.
pub fn skip(reason: &str) {
    if require_all_backends() {
        panic!("AIO_REQUIRE_ALL_BACKENDS=1 but this test would skip: {reason}");
    }
    println!("skipped: {reason}");
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Installs a no-op SIGURG handler without `SA_RESTART`, so a SIGURG sent to a thread makes
/// its blocking syscall fail with `EINTR`; the tests that check EINTR is retried send it.
pub fn interrupt_with_sigurg() {
    // SAFETY: installs a handler that does nothing (async-signal-safe) for SIGURG, without
    // SA_RESTART. SIGURG is ignored by default, so a stray one is harmless to other tests, and
    // the handler is never removed.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as *const () as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut());
    }
}

/// A thread that sends SIGURG to the thread that made it every `every` until dropped (which
/// stops and joins it, a failing test included): `EINTR` in every blocking call made meanwhile.
pub struct SignalStorm {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SignalStorm {
    /// Starts sending (installing the handler first, see [`interrupt_with_sigurg`]), and
    /// returns once the first signal is sent.
    pub fn start(every: Duration) -> SignalStorm {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        interrupt_with_sigurg();
        // SAFETY: pthread_self has no preconditions.
        let target = unsafe { libc::pthread_self() };
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let (first_sent, started) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                // SAFETY: `target` is alive: the storm is dropped (and this thread joined) on
                // the target thread, before it can exit.
                unsafe { libc::pthread_kill(target, libc::SIGURG) };
                if n.fetch_add(1, Ordering::Relaxed) == 0 {
                    let _ = first_sent.send(());
                }
                std::thread::sleep(every);
            }
        });
        // The storm has begun when this returns, however late the new thread got a CPU: a
        // test never runs its calls before the first signal by the machine's load alone.
        let _ = started.recv();
        SignalStorm {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    /// Signals sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for SignalStorm {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Why a test cannot run here, found part-way through it (a limit shared with the tests
/// running beside it, say): [`skip_test`] unwinds with it and [`run_test`] reports it.
#[derive(Debug)]
pub struct SkipTest(pub String);

/// Ends the running test as skipped with `reason`: unwinds (without the panic hook's message)
/// to the [`run_test`] around it, which reports it through [`skip`].
pub fn skip_test(reason: impl Into<String>) -> ! {
    std::panic::resume_unwind(Box::new(SkipTest(reason.into())))
}

/// Runs a test's body; a [`skip_test`] inside it becomes a [`skip`] (`skipped: name:
/// reason`, or a failure under `AIO_REQUIRE_ALL_BACKENDS=1`), any other panic goes on.
/// The conformance macros run every test through it.
pub fn run_test(name: &str, body: impl FnOnce()) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(()) => {}
        Err(payload) => match payload.downcast::<SkipTest>() {
            Ok(why) => skip(&format!("{name}: {}", why.0)),
            Err(other) => std::panic::resume_unwind(other),
        },
    }
}

/// Builds what a test needs with `build`, retrying for up to 10 s while the error
/// `is_shared_limit` (a budget the tests running in parallel share and give back, as
/// io_uring's rings share the locked-memory limit of the user), then ends the test with
/// [`skip_test`] naming the error. Any other error fails the test.
pub fn build_within_limits<T, E: std::fmt::Display>(
    what: &str,
    mut build: impl FnMut() -> Result<T, E>,
    is_shared_limit: impl Fn(&E) -> bool,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match build() {
            Ok(v) => return v,
            Err(e) if is_shared_limit(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if is_shared_limit(&e) => skip_test(format!("{what}: {e}")),
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Generates one `#[test]` per conformance test, each building its monitor with `$make`. With
/// `probe: $probe` (an expression giving `Result<_, impl Display>`), each test first asks
/// whether the kernel supports the monitor and, if not, reports `skipped: <reason>` (a failure
/// under `AIO_REQUIRE_ALL_BACKENDS=1`).
#[macro_export]
macro_rules! event_loop_conformance {
    (probe: $probe:expr, $make:expr) => {
        $crate::event_loop_conformance!(@all ($probe), $make);
    };
    ($make:expr) => {
        $crate::event_loop_conformance!(@all (::std::result::Result::<(), &str>::Ok(())), $make);
    };
    (@all ($probe:expr), $make:expr) => {
        $crate::event_loop_conformance!(@tests ($probe), $make; event_loop:
            readable_fd_runs_io_read,
            writable_fd_runs_io_write,
            handler_removes_itself_and_another_during_dispatch,
            handler_added_from_callback_runs,
            handler_replaced_from_its_own_callback,
            bottom_halves_from_eight_threads_each_run_once,
            cancelled_bottom_half_does_not_run,
            bottom_half_scheduled_while_bottom_halves_run_waits_for_next_iteration,
            oneshot_and_deleted_bottom_halves,
            idle_bottom_half_runs_in_a_wait_that_blocks,
            timers_fire_in_deadline_order_and_never_early,
            wait_timeout_follows_bottom_halves_and_timers,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; event_loop_wait:
            notify_from_another_thread_wakes_blocked_poll,
            no_notifier_write_while_loop_not_blocked,
            io_poll_handler_found_without_blocking_wait,
            handler_without_io_poll_does_not_switch_polling_off,
            nested_poll_loses_and_duplicates_nothing,
            many_registered_fds_one_active,
            fd_closed_while_registered_is_handled,
            eintr_during_wait_is_retried,
            bad_input_gets_typed_errors_and_loop_keeps_running,
            io_poll_begin_and_end_bracket_polling_mode,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; tasks:
            async_waker_from_another_thread_wakes_a_blocked_loop,
            async_sleep_readiness_and_nested_block_on,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; iothread:
            monitor_runs_inside_an_iothread,
        );
        $crate::event_loop_conformance!(@tests ($probe), $make; contract:
            monitor_refuses_duplicates_and_unknown_fds,
            one_iteration_runs_bottom_halves_then_handlers_then_timers,
            hang_up_reaches_io_read,
        );
    };
    (@tests ($probe:expr), $make:expr; $module:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if $crate::available(::std::stringify!($name), $probe).is_none() {
                    return;
                }
                $crate::run_test(::std::stringify!($name), || {
                    $crate::$module::$name(|| $make)
                });
            }
        )*
    };
}

/// A non-blocking pipe.
#[derive(Debug)]
pub struct Pipe {
    /// The read end.
    pub read: OwnedFd,
    /// The write end.
    pub write: OwnedFd,
}

impl Pipe {
    /// A new non-blocking, close-on-exec pipe.
    pub fn new() -> Pipe {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a writable array of two ints.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
        // SAFETY: both fds are fresh and owned by nobody else.
        unsafe {
            Pipe {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        }
    }

    /// Writes one byte.
    pub fn poke(&self) {
        write_byte(self.write.as_fd());
    }

    /// Reads everything available; returns the byte count.
    pub fn drain(&self) -> usize {
        drain_fd(self.read.as_fd())
    }
}

impl Default for Pipe {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes one byte to `fd`, asserting success.
pub fn write_byte(fd: impl AsFd) {
    let b = 1u8;
    // SAFETY: one byte from a live local, to an fd the caller lends us.
    let r = unsafe { libc::write(fd.as_fd().as_raw_fd(), (&b as *const u8).cast(), 1) };
    assert_eq!(r, 1, "write: {}", std::io::Error::last_os_error());
}

/// Reads `fd` until it would block; returns the byte count.
pub fn drain_fd(fd: impl AsFd) -> usize {
    let fd = fd.as_fd().as_raw_fd();
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r <= 0 {
            return total;
        }
        total += r as usize;
    }
}

/// Raises the soft fd limit to the hard limit (tests open hundreds of pipes).
pub fn raise_fd_limit() -> u64 {
    aio_core::kit::raise_fd_limit()
}

/// Arms a timer that sets the returned flag after `limit`: a test that blocks checks the flag
/// to fail instead of hanging forever.
pub fn watchdog<L: EventLoop>(ctx: &AioContext<L>, limit: Duration) -> Rc<Cell<bool>> {
    let fired = Rc::new(Cell::new(false));
    let f = fired.clone();
    let t = ctx.timer_new(move |_| f.set(true));
    ctx.timer_mod_in(t, limit).expect("watchdog timer");
    fired
}

/// Polls (blocking) until `done()` or the watchdog fires; panics on the latter.
pub fn poll_until<L: EventLoop>(ctx: &AioContext<L>, what: &str, mut done: impl FnMut() -> bool) {
    let dog = watchdog(ctx, Duration::from_secs(20));
    while !done() {
        assert!(!dog.get(), "timed out waiting for: {what}");
        ctx.poll(true);
    }
}

pub(crate) fn counter() -> Rc<Cell<usize>> {
    Rc::new(Cell::new(0))
}

pub(crate) fn bump(c: &Rc<Cell<usize>>) {
    c.set(c.get() + 1);
}

pub(crate) fn ctx_of<L: EventLoop>(make: &impl Fn() -> L) -> AioContext<L> {
    AioContext::new(make()).expect("context")
}
