//! Small syscall helpers shared by aio-core and the backends.
//!
//! This module owns the conversions between Rust and the C ABI (return codes, timespecs, fd
//! checks). It holds no state and never closes a descriptor it did not create.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Turns a `-1` return into `io::Error::last_os_error()`.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Whether `fd` names an open file descriptor of this process (`fcntl(F_GETFD)`).
pub fn fd_is_open(fd: RawFd) -> bool {
    if fd < 0 {
        return false;
    }
    // SAFETY: F_GETFD reads descriptor flags; it takes no pointer and cannot affect the fd.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Converts a wait timeout to a `timespec`, saturating at the largest representable value.
///
/// `Duration` holds up to `u64::MAX` seconds while `time_t` is signed; saturating keeps a huge
/// timeout meaning "wait practically forever" instead of wrapping into a negative (invalid) one.
pub fn timespec_from(d: Duration) -> libc::timespec {
    let secs = libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX);
    libc::timespec {
        tv_sec: secs,
        tv_nsec: d.subsec_nanos() as _,
    }
}

/// The pointer a syscall takes for an optional timeout: null for none (wait without limit),
/// else `ts` (which must outlive the call).
pub fn timespec_ptr(ts: Option<&libc::timespec>) -> *const libc::timespec {
    ts.map_or(std::ptr::null(), |t| t as *const libc::timespec)
}

/// Converts a timeout to whole milliseconds for APIs that take an `int` in ms, rounding *up*
/// so that a wait never ends before its deadline (a 1 ns timeout becomes 1 ms, not 0).
/// `None` (infinite) becomes `-1`; values past `i32::MAX` ms saturate.
pub fn timeout_ms_round_up(timeout: Option<Duration>) -> libc::c_int {
    match timeout {
        None => -1,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
        }
    }
}

/// Raises the soft limit of open fds to the hard limit (hundreds of registered fds need
/// more than the usual 1024) and returns the new soft limit.
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespec_saturates() {
        let ts = timespec_from(Duration::MAX);
        assert_eq!(ts.tv_sec, libc::time_t::MAX);
        let ts = timespec_from(Duration::new(3, 7));
        assert_eq!((ts.tv_sec, ts.tv_nsec), (3, 7));
    }

    #[test]
    fn ms_rounds_up() {
        assert_eq!(timeout_ms_round_up(None), -1);
        assert_eq!(timeout_ms_round_up(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms_round_up(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms_round_up(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_ms_round_up(Some(Duration::MAX)), libc::c_int::MAX);
    }

    #[test]
    fn fd_checks() {
        assert!(fd_is_open(0) || fd_is_open(1) || fd_is_open(2));
        assert!(!fd_is_open(-1));
        assert!(!fd_is_open(1_000_000));
    }
}
