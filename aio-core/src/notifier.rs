//! The cross-thread wake-up object (QEMU's `EventNotifier`).
//!
//! This module owns the notifier's file descriptors and nothing else: it knows nothing about
//! event loops. A [`Notifier`] is an eventfd (non-blocking, close-on-exec); where the kernel has
//! no eventfd it falls back to a non-blocking pipe. Either way it exposes one pollable fd that is
//! readable while the notifier is set.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::unistd;

/// Whether `AIO_NOTIFIER=pipe` asks for pipe notifiers (read once).
fn pipe_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| std::env::var("AIO_NOTIFIER").is_ok_and(|v| v == "pipe"))
}

/// Which kernel object backs a [`Notifier`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifierKind {
    /// An `eventfd(2)` counter: one fd, 8-byte reads and writes.
    EventFd,
    /// A `pipe2(2)`: the read end is polled, the write end is written.
    Pipe,
}

/// A cross-thread wake-up object with a pollable fd.
///
/// `notify()` makes the fd readable; `test_and_clear()` makes it unreadable again and says
/// whether it was set. Both take `&self` and the type is `Send + Sync`, so one notifier can be
/// shared between the thread that signals and the loop that waits.
#[derive(Debug)]
pub struct Notifier {
    read: OwnedFd,
    /// The pipe's write end; `None` for an eventfd (the one fd is read and written).
    write: Option<OwnedFd>,
}

impl Notifier {
    /// Creates an eventfd notifier, falling back to a pipe where eventfd is missing
    /// (`ENOSYS`), refused (`EINVAL`) or forbidden (`EPERM` / `EACCES`: a seccomp filter or a
    /// security module). With `AIO_NOTIFIER=pipe` in the environment (read once per process)
    /// every notifier made here is a pipe: the fallback path, on purpose, for testing it or
    /// for an environment whose eventfd misbehaves.
    pub fn new() -> io::Result<Self> {
        if pipe_forced() {
            return Self::new_pipe();
        }
        match Self::new_eventfd() {
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::EINVAL | libc::EPERM | libc::EACCES)
                ) =>
            {
                Self::new_pipe()
            }
            Err(e) => Err(e),
        }
    }

    /// Creates an eventfd notifier (no fallback).
    pub fn new_eventfd() -> io::Result<Self> {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Self {
            read: OwnedFd::from(fd),
            write: None,
        })
    }

    /// Creates a pipe notifier (the fallback, also usable on purpose, e.g. in tests).
    pub fn new_pipe() -> io::Result<Self> {
        let (read, write) = unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        Ok(Self {
            read,
            write: Some(write),
        })
    }

    /// A second handle on the same notifier (its fds duplicated): notifying either sets both,
    /// and the clone may outlive the original (e.g. in a thread that signals it later).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            read: self.read.try_clone()?,
            write: self.write.as_ref().map(OwnedFd::try_clone).transpose()?,
        })
    }

    /// Which kernel object backs this notifier.
    pub fn kind(&self) -> NotifierKind {
        if self.write.is_some() {
            NotifierKind::Pipe
        } else {
            NotifierKind::EventFd
        }
    }

    /// Sets the notifier: its fd becomes readable.
    ///
    /// A notifier that is already set stays set; a full eventfd counter or a full pipe is not an
    /// error (the fd is readable either way).
    pub fn notify(&self) -> io::Result<()> {
        let value = 1u64.to_ne_bytes();
        let fd = self.write.as_ref().unwrap_or(&self.read);
        // A pipe only needs one byte; an eventfd needs exactly eight.
        let len = if self.write.is_some() { 1 } else { 8 };
        loop {
            match unistd::write(fd, &value[..len]) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Clears the notifier and returns whether it was set.
    pub fn test_and_clear(&self) -> bool {
        let mut buf = [0u8; 512];
        let mut was_set = false;
        loop {
            // An eventfd read returns the whole counter (8 bytes); a pipe may hold many bytes,
            // so drain it until EAGAIN.
            let len = if self.write.is_some() { buf.len() } else { 8 };
            match unistd::read(&self.read, &mut buf[..len]) {
                Ok(r) if r > 0 => {
                    was_set = true;
                    if self.write.is_none() || r < len {
                        return true;
                    }
                }
                Err(Errno::EINTR) => {}
                // EAGAIN (drained), end of file, or an error: nothing more to clear.
                _ => return was_set,
            }
        }
    }
}

impl AsFd for Notifier {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

impl AsRawFd for Notifier {
    fn as_raw_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    fn readable(n: &Notifier) -> bool {
        let mut pfd = [PollFd::new(n.as_fd(), PollFlags::POLLIN)];
        let r = poll(&mut pfd, PollTimeout::ZERO).unwrap();
        r == 1
            && pfd[0]
                .revents()
                .is_some_and(|e| e.contains(PollFlags::POLLIN))
    }

    fn exercise(n: Notifier) {
        let clone = n.try_clone().unwrap();
        clone.notify().unwrap();
        assert!(readable(&n), "a clone's notify sets the original");
        assert!(n.test_and_clear());
        drop(clone);
        assert!(!n.test_and_clear(), "a new notifier is clear");
        assert!(!readable(&n));
        n.notify().unwrap();
        n.notify().unwrap();
        assert!(readable(&n), "notify makes the fd readable");
        assert!(n.test_and_clear());
        assert!(!readable(&n), "test_and_clear drains every notification");
        assert!(!n.test_and_clear());
    }

    #[test]
    fn eventfd_set_and_clear() {
        let n = Notifier::new_eventfd().unwrap();
        assert_eq!(n.kind(), NotifierKind::EventFd);
        exercise(n);
    }

    #[test]
    fn pipe_set_and_clear() {
        let n = Notifier::new_pipe().unwrap();
        assert_eq!(n.kind(), NotifierKind::Pipe);
        exercise(n);
    }

    #[test]
    fn pipe_full_is_not_an_error() {
        let n = Notifier::new_pipe().unwrap();
        // A pipe holds 64 KiB by default; 100k one-byte writes overflow it.
        for _ in 0..100_000 {
            n.notify().unwrap();
        }
        assert!(n.test_and_clear());
        assert!(!readable(&n));
    }

    #[test]
    fn eventfd_full_counter_is_not_an_error() {
        let n = Notifier::new_eventfd().unwrap();
        let max: u64 = u64::MAX - 1;
        assert_eq!(unistd::write(&n, &max.to_ne_bytes()), Ok(8));
        n.notify().unwrap();
        assert!(n.test_and_clear());
    }

    #[test]
    fn notify_from_another_thread() {
        let n = std::sync::Arc::new(Notifier::new().unwrap());
        let n2 = n.clone();
        std::thread::spawn(move || n2.notify().unwrap())
            .join()
            .unwrap();
        assert!(n.test_and_clear());
    }
}
