//! Settings of the whole process, not of one loop: what a program serving many fds may want
//! to change once at start.
//!
//! This module owns nothing of a context; every function here changes the process for all
//! its threads.

/// Raises the process's soft limit of open fds (`RLIMIT_NOFILE`) to its hard limit, for every
/// thread of the process (hundreds of registered fds need more than the usual 1024), and
/// returns the new soft limit (0 when the limit cannot be read).
pub fn raise_fd_limit() -> u64 {
    crate::sys::raise_fd_limit()
}
