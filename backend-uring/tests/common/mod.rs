//! Rings for the tests. Under a small locked-memory limit (`ulimit -l 64` without
//! `CAP_IPC_LOCK`, as in an unprivileged container) the kernel charges every ring to one
//! budget per user, which the tests running in parallel share: a ring that does not fit now is
//! retried while the others give theirs back, and after 10 s the test says `skipped:` with the
//! limit named. Any other error fails the test.
//!
//! Also what the test files share beside the rings: whether io_uring is usable here at all,
//! the pipes whose reads wait in the kernel, and how those reads are finished.
#![allow(dead_code)] // Each test binary uses some of these.

use aio_backend_uring::{
    probe, shared_ring, UringConfig, UringEngine, UringLoop, UringUnavailable,
};
use aio_conformance::engine::wait_for;

/// Whether io_uring is usable on this kernel; if not, the test says `skipped:` why (a failure
/// under `AIO_REQUIRE_ALL_BACKENDS=1`).
pub fn available() -> bool {
    aio_conformance::available("io_uring unusable", probe()).is_some()
}

fn is_memlock(e: &UringUnavailable) -> bool {
    matches!(e, UringUnavailable::OutOfLockedMemory { .. })
}

/// An engine with `config`.
pub fn engine(config: UringConfig) -> UringEngine {
    aio_conformance::build_within_limits("io_uring_setup", || UringEngine::new(config), is_memlock)
}

/// An fd monitor on its own ring.
pub fn monitor() -> UringLoop {
    aio_conformance::build_within_limits("io_uring_setup", UringLoop::new, is_memlock)
}

/// A monitor and an engine on one ring.
pub fn shared(config: UringConfig) -> (UringLoop, UringEngine) {
    aio_conformance::build_within_limits("shared ring", || shared_ring(config), is_memlock)
}

/// A pipe (read end, write end) as files; the read end is what the engine reads.
pub fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    use std::os::fd::FromRawFd;
    // SAFETY: both fds were just created and are owned by nobody else.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

/// A read of 64 bytes from a pipe's read end: it waits in the kernel until something is
/// written or the write end closes.
pub fn pipe_read(read_end: &aio_core::engine::IoFile, token: u64) -> aio_core::engine::Request {
    aio_core::engine::Request::read(read_end, 0, aio_core::engine::AlignedBuf::new(64), token)
}

/// Closes the write end of a pipe the engine reads: every read still waiting (`n` of them)
/// completes with 0 bytes (end of file), and the kernel holds none any more.
pub fn finish(mut engine: UringEngine, write_end: std::fs::File, n: usize) {
    drop(write_end);
    let done = wait_for(&mut engine, n);
    assert!(
        done.iter().all(|c| c.result.as_ref().ok() == Some(&0)),
        "{done:?}"
    );
    assert_eq!(engine.in_kernel(), 0);
}
