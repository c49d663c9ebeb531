//! The fd-monitor contract (QEMU's `fdmon`): what every backend implements.
//!
//! This module owns the trait and its value types only. A monitor is deliberately small and
//! dumb: it remembers which fds to watch, for what, under which token, and waits. All policy
//! (handlers, bottom halves, timers, polling, retrying `EINTR`) lives in
//! `aio-loop`'s `AioContext`, once, so backends cannot drift apart.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

/// An opaque value a monitor reports back with each event of an fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub u64);

/// What to watch an fd for: an opaque set of directions, built from the constants and `|`
/// (`Interest::READABLE | Interest::WRITABLE`), as `mio` does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Interest(u8);

const READ_BIT: u8 = 1;
const WRITE_BIT: u8 = 2;

impl Interest {
    /// Report when a read would not block (data, EOF, hang-up or error).
    pub const READABLE: Interest = Interest(READ_BIT);
    /// Report when a write would not block.
    pub const WRITABLE: Interest = Interest(WRITE_BIT);
    /// Both readable and writable.
    pub const BOTH: Interest = Interest(READ_BIT | WRITE_BIT);
    /// Neither (the fd stays registered but is not reported).
    pub const NONE: Interest = Interest(0);

    /// Whether reads are of interest.
    pub const fn is_readable(self) -> bool {
        self.0 & READ_BIT != 0
    }

    /// Whether writes are of interest.
    pub const fn is_writable(self) -> bool {
        self.0 & WRITE_BIT != 0
    }

    /// Whether neither direction is of interest.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// This interest with `other`'s directions added (`|` in a `const`).
    pub const fn add(self, other: Interest) -> Interest {
        Interest(self.0 | other.0)
    }

    /// This interest without `other`'s directions.
    pub const fn remove(self, other: Interest) -> Interest {
        Interest(self.0 & !other.0)
    }

    /// The `poll(2)` event mask for this interest.
    pub fn to_poll_events(self) -> libc::c_short {
        let mut ev = 0;
        if self.is_readable() {
            ev |= libc::POLLIN;
        }
        if self.is_writable() {
            ev |= libc::POLLOUT;
        }
        ev
    }
}

impl std::ops::BitOr for Interest {
    type Output = Interest;
    fn bitor(self, other: Interest) -> Interest {
        self.add(other)
    }
}

impl std::ops::BitOrAssign for Interest {
    fn bitor_assign(&mut self, other: Interest) {
        *self = self.add(other);
    }
}

impl std::fmt::Debug for Interest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.is_readable(), self.is_writable()) {
            (true, true) => f.write_str("READABLE | WRITABLE"),
            (true, false) => f.write_str("READABLE"),
            (false, true) => f.write_str("WRITABLE"),
            (false, false) => f.write_str("NONE"),
        }
    }
}

/// One readiness report of a monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The token the fd was registered with.
    pub token: Token,
    /// A read would not block (includes hang-up and error).
    pub readable: bool,
    /// A write would not block (includes error).
    pub writable: bool,
    /// The fd is no longer open (`POLLNVAL`); only reported by monitors whose
    /// [`EventLoop::reports_closed_fds`] is true.
    pub invalid: bool,
}

impl Event {
    /// Builds an event from a `poll(2)`-style `revents` mask.
    ///
    /// Shared by every monitor whose kernel interface speaks poll bits (ppoll, epoll and
    /// io_uring's `POLL_ADD` all do), so the readiness mapping of the contract lives once.
    pub fn from_poll_bits(token: Token, revents: u32) -> Event {
        let bits = |b: libc::c_short| revents & (b as u16 as u32) != 0;
        let err = bits(libc::POLLERR);
        Event {
            token,
            readable: bits(libc::POLLIN) || bits(libc::POLLHUP) || bits(libc::POLLRDHUP) || err,
            writable: bits(libc::POLLOUT) || err,
            invalid: bits(libc::POLLNVAL),
        }
    }
}

/// The first check of every `register`: the raw number of `fd` when the monitor does not
/// know it yet (`is_known(fd)` false), else the contract's [`already_registered`] error.
pub fn ensure_new(fd: BorrowedFd<'_>, is_known: impl FnOnce(RawFd) -> bool) -> io::Result<RawFd> {
    let fd = fd.as_raw_fd();
    if is_known(fd) {
        Err(already_registered(fd))
    } else {
        Ok(fd)
    }
}

/// `Ok` for an fd the monitor knows (`known` true), else the contract's [`not_registered`]
/// error: the first check of every `modify` and `deregister`.
pub fn ensure_known(known: bool, fd: RawFd) -> io::Result<()> {
    if known {
        Ok(())
    } else {
        Err(not_registered(fd))
    }
}

/// The contract's error for `register` of an fd that is already registered
/// (`io::ErrorKind::AlreadyExists`); every monitor returns this one.
pub fn already_registered(fd: RawFd) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("fd {fd} is already registered"),
    )
}

/// The contract's error for `modify` or `deregister` of an fd that is not registered
/// (`io::ErrorKind::NotFound`); every monitor returns this one.
pub fn not_registered(fd: RawFd) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("fd {fd} is not registered"),
    )
}

/// A pluggable fd monitor: register fds with an interest and a token, wait for readiness.
///
/// # The contract a backend must keep
///
/// * **Level-triggered.** An fd that stays ready is reported by every `wait` until it is not.
/// * **One registration per fd.** `register` of an fd already registered fails with
///   `io::ErrorKind::AlreadyExists`; `modify` and `deregister` of an unknown fd fail with
///   `io::ErrorKind::NotFound`.
/// * **Tokens are opaque.** The monitor reports the token given at registration and never
///   interprets it.
/// * **Readiness mapping.** Hang-up and error conditions are reported as `readable` (a read then
///   returns the EOF or the error), `error` additionally sets `writable` for write interest.
///   A registered fd that was closed behind the monitor's back is reported with `invalid` where
///   the kernel says so (`POLLNVAL`); monitors whose kernel interface forgets closed fds
///   (epoll, io_uring poll) report nothing and say so through
///   [`EventLoop::reports_closed_fds`].
/// * **Timeouts.** `None` waits until an event; `Some(d)` waits at most `d`, never returning
///   early because of rounding (a monitor with millisecond resolution rounds up). `Some(ZERO)`
///   never blocks.
/// * **Signals.** `wait` returns `io::ErrorKind::Interrupted` on `EINTR`; the caller retries
///   with a recomputed timeout.
/// * **`wait` appends** to `events` and never clears it; it may report fewer events than are
///   ready (the rest come next time, they are level-triggered).
pub trait EventLoop {
    /// A short, stable name for reports (`"poll"`, `"epoll"`, ...).
    fn name(&self) -> &'static str;

    /// Starts watching `fd` for `interest`, reporting `token`.
    ///
    /// The registration outlives the borrow: the caller deregisters the fd before it closes
    /// it. An fd closed while registered is not undefined behaviour, only a lost registration:
    /// the kernel forgets it (epoll, io_uring) or reports it [`Event::invalid`] (ppoll), and the
    /// caller then calls [`EventLoop::forget_closed`].
    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()>;

    /// Changes the interest and token of a registered fd.
    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()>;

    /// Stops watching `fd`.
    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()>;

    /// Drops the registration of fd number `fd`, which was found closed (an [`Event::invalid`]
    /// report): the monitor forgets it without acting on the number, which may already name
    /// another file. `NotFound` if nothing is registered under it.
    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()>;

    /// Waits for readiness for at most `timeout` (`None`: no limit) and appends the events
    /// to `events`.
    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()>;

    /// How many fds are registered.
    fn registered(&self) -> usize;

    /// Whether a registered fd that gets closed is reported with [`Event::invalid`].
    fn reports_closed_fds(&self) -> bool {
        false
    }

    /// A more specific name when the monitor is composite (the hybrid says which side is
    /// active, e.g. `"hybrid(epoll)"`); defaults to [`EventLoop::name`].
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// Whether a `wait` now would find events or has work to hand the kernel, known without
    /// a system call (QEMU's `fdmon_ops->need_wait`): busy polling stops as soon as it says
    /// so, since only the wait delivers what the monitor holds.
    ///
    /// * A monitor whose readiness lands in shared memory (io_uring's completion queue) says
    ///   `true` when a completion is there, when the kernel holds one as task work, or when
    ///   polls wait to be armed or entries to be submitted.
    /// * `false` (the default) means "not known": a monitor that can only learn of readiness
    ///   by a system call (poll, epoll) never cuts busy polling short.
    /// * It never consumes an event or changes a registration.
    fn needs_wait(&self) -> bool {
        false
    }
}

impl<T: EventLoop + ?Sized> EventLoop for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        (**self).register(fd, token, interest)
    }
    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        (**self).modify(fd, token, interest)
    }
    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        (**self).deregister(fd)
    }
    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()> {
        (**self).forget_closed(fd)
    }
    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        (**self).wait(timeout, events)
    }
    fn registered(&self) -> usize {
        (**self).registered()
    }
    fn reports_closed_fds(&self) -> bool {
        (**self).reports_closed_fds()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn needs_wait(&self) -> bool {
        (**self).needs_wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_bits_mapping() {
        let t = Token(7);
        let e = Event::from_poll_bits(t, libc::POLLIN as u32);
        assert!(e.readable && !e.writable && !e.invalid);
        let e = Event::from_poll_bits(t, libc::POLLHUP as u32);
        assert!(e.readable && !e.writable);
        let e = Event::from_poll_bits(t, libc::POLLERR as u32);
        assert!(e.readable && e.writable);
        let e = Event::from_poll_bits(t, libc::POLLNVAL as u32);
        assert!(e.invalid && !e.readable);
        assert_eq!(
            Interest::BOTH.to_poll_events(),
            libc::POLLIN | libc::POLLOUT
        );
    }

    #[test]
    fn interest_is_a_bit_set() {
        let both = Interest::READABLE | Interest::WRITABLE;
        assert_eq!(both, Interest::BOTH);
        assert!(both.is_readable() && both.is_writable() && !both.is_empty());
        assert_eq!(both.remove(Interest::WRITABLE), Interest::READABLE);
        let mut i = Interest::NONE;
        assert!(i.is_empty() && !i.is_readable());
        i |= Interest::WRITABLE;
        assert!(i.is_writable() && !i.is_readable());
        assert_eq!(format!("{both:?}"), "READABLE | WRITABLE");
        assert_eq!(Interest::default(), Interest::NONE);
    }
}
