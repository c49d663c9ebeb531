//! # aio-backend-epoll
//!
//! An [`EventLoop`] over `epoll(7)`: a wakeup costs O(ready fds), not O(registered fds), which
//! is what keeps a loop with hundreds of idle disks as fast as one with a single disk.
//!
//! * Level-triggered, 128 events per `epoll_wait`; when a wait fills the buffer the monitor asks
//!   again without blocking (up to the number of registered fds), so a burst of ready fds is
//!   not spread over several iterations.
//! * Nanosecond timeouts through `epoll_pwait2(2)` (Linux 5.11+); on older kernels
//!   `epoll_wait` with the timeout rounded *up* to whole milliseconds, so no wait ends early.
//!   [`EpollLoop::has_pwait2`] says which is in use.
//! * The kernel forgets an fd when its file is closed, so a closed registered fd is not
//!   reported ([`EventLoop::reports_closed_fds`] is false), and deregistering it succeeds.
//! * epoll refuses regular files (`EPERM`): register returns that error.
//!
//! ```
//! use aio_backend_epoll::EpollLoop;
//! use aio_loop::AioContext;
//! let ctx = AioContext::new(EpollLoop::new().unwrap()).unwrap();
//! assert_eq!(ctx.monitor_name(), "epoll");
//! ```

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use aio_core::kit::{
    cvt, ensure_known, ensure_new, timeout_ms_round_up, timespec_from, timespec_ptr,
};
use aio_core::{Event, EventLoop, Interest, Token};

/// Events fetched per `epoll_wait` call.
pub const EVENTS_PER_WAIT: usize = 128;

/// The `epoll(7)` monitor.
///
/// `Send + Sync`: an epoll fd and plain data; build it anywhere, run it on the loop's thread.
#[derive(Debug)]
pub struct EpollLoop {
    epfd: OwnedFd,
    registered: HashSet<RawFd>,
    buffer: Vec<libc::epoll_event>,
    pwait2: bool,
}

fn epoll_event(token: Token, interest: Interest) -> libc::epoll_event {
    let mut events = 0u32;
    if interest.is_readable() {
        events |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
    }
    if interest.is_writable() {
        events |= libc::EPOLLOUT as u32;
    }
    libc::epoll_event {
        events,
        u64: token.0,
    }
}

/// Whether this kernel allows epoll here: creates and closes an epoll instance (a seccomp
/// filter may refuse `epoll_create1`). For the facade's `aio::Ladder` rungs.
pub fn probe() -> io::Result<()> {
    EpollLoop::new().map(drop)
}

impl EpollLoop {
    /// Creates the epoll instance (close-on-exec).
    pub fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; the result is checked.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(EpollLoop {
            // SAFETY: `fd` is a fresh descriptor owned by nobody else.
            epfd: unsafe { OwnedFd::from_raw_fd(fd) },
            registered: HashSet::new(),
            buffer: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT],
            pwait2: true,
        })
    }

    /// Whether waits use `epoll_pwait2` (ns timeouts) rather than `epoll_wait` (ms, rounded up).
    /// Known after the first timed wait; true until `ENOSYS` proves otherwise.
    pub fn has_pwait2(&self) -> bool {
        self.pwait2
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, ev: Option<libc::epoll_event>) -> io::Result<()> {
        let mut ev = ev.unwrap_or(libc::epoll_event { events: 0, u64: 0 });
        // SAFETY: `ev` is a live epoll_event for the duration of the call (ignored for DEL).
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    fn push_events(&self, n: usize, events: &mut Vec<Event>) {
        for ev in &self.buffer[..n] {
            events.push(Event::from_poll_bits(Token(ev.u64), ev.events));
        }
    }

    /// One kernel wait into `self.buffer`; returns the number of events.
    fn wait_once(&mut self, timeout: Option<Duration>) -> io::Result<usize> {
        let epfd = self.epfd.as_raw_fd();
        let buf = self.buffer.as_mut_ptr();
        let max = self.buffer.len() as libc::c_int;
        if self.pwait2 && timeout.is_some_and(|t| !t.is_zero()) {
            let ts = timeout.map(timespec_from);
            let ts_ptr = timespec_ptr(ts.as_ref());
            // SAFETY: `buf` has room for `max` events and is exclusively borrowed; `ts_ptr` is
            // null or points to `ts`, alive across the call; a null sigmask (size ignored) keeps
            // the current mask.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    epfd,
                    buf,
                    max,
                    ts_ptr,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let err = io::Error::last_os_error();
            // ENOSYS: kernel before 5.11. EPERM: a seccomp profile that predates the syscall.
            if !matches!(err.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) {
                return Err(err);
            }
            self.pwait2 = false;
        }
        // SAFETY: as above; the timeout is an int in ms (-1 = infinite), rounded up.
        let n = unsafe { libc::epoll_wait(epfd, buf, max, timeout_ms_round_up(timeout)) };
        cvt(n).map(|n| n as usize)
    }
}

impl EventLoop for EpollLoop {
    fn name(&self) -> &'static str {
        "epoll"
    }

    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let fd = ensure_new(fd, |fd| self.registered.contains(&fd))?;
        self.ctl(libc::EPOLL_CTL_ADD, fd, Some(epoll_event(token, interest)))?;
        self.registered.insert(fd);
        Ok(())
    }

    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let fd = fd.as_raw_fd();
        ensure_known(self.registered.contains(&fd), fd)?;
        self.ctl(libc::EPOLL_CTL_MOD, fd, Some(epoll_event(token, interest)))
    }

    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let fd = fd.as_raw_fd();
        ensure_known(self.registered.contains(&fd), fd)?;
        match self.ctl(libc::EPOLL_CTL_DEL, fd, None) {
            // Closed since registration: the kernel already dropped it.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF) | Some(libc::ENOENT)) => {}
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        self.registered.remove(&fd);
        Ok(())
    }

    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()> {
        // epoll drops a closed fd from its set by itself; `EPOLL_CTL_DEL` on the number could
        // reach a file that reused it, so only our record goes.
        ensure_known(self.registered.remove(&fd), fd)?;
        Ok(())
    }

    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        let n = self.wait_once(timeout)?;
        let first = events.len();
        self.push_events(n, events);
        if n < self.buffer.len() {
            return Ok(());
        }
        // A full buffer may mean more are ready: ask again without blocking. Level-triggered
        // fds go back to the tail of the kernel's ready list once reported, so the first
        // token coming round again means everything ready has been seen.
        let wrap = Token(self.buffer[0].u64);
        loop {
            let n = self.wait_once(Some(Duration::ZERO))?;
            let before = events.len();
            self.push_events(n, events);
            if let Some(pos) = events[before..].iter().position(|e| e.token == wrap) {
                events.truncate(before + pos);
                return Ok(());
            }
            if n < self.buffer.len() || events.len() - first >= self.registered.len() {
                return Ok(());
            }
        }
    }

    fn registered(&self) -> usize {
        self.registered.len()
    }
}
