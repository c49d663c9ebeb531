//! The hybrid monitor: one small-set monitor below a threshold, one large-set monitor above.
//!
//! QEMU stays on ppoll(2) while few fds are registered (an `epoll_ctl` per change costs more
//! than scanning a handful of pollfds) and moves every registration to epoll at 64. This module
//! owns that switching and the registry that makes it lossless; it is generic over the two
//! monitors so that backends stay independent of each other. In this project "hybrid" always
//! means `Hybrid<PollLoop, EpollLoop>` with [`DEFAULT_HYBRID_THRESHOLD`].

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use aio_core::{Event, EventLoop, Interest, Token};

/// QEMU's switch point: epoll from 64 registered fds up.
pub const DEFAULT_HYBRID_THRESHOLD: usize = 64;

/// Which side of a [`Hybrid`] is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HybridSide {
    /// The small-set monitor (ppoll).
    Small,
    /// The large-set monitor (epoll).
    Large,
}

/// An [`EventLoop`] over a small-set monitor `S` and a large-set monitor `G`.
///
/// `Send` / `Sync` when both monitors are.
///
/// Switching happens inside `register` / `deregister`, never during a wait; both monitors are
/// level-triggered, so an fd that was ready before the switch is reported by the new monitor's
/// next wait: no event is lost. If the large monitor refuses an fd (epoll refuses regular files
/// with `EPERM`), the upgrade is rolled back and the hybrid stays small, as QEMU does.
/// Downgrading happens below half the threshold, so a set hovering around the threshold does not
/// flap between monitors.
#[derive(Debug)]
pub struct Hybrid<S, G> {
    small: S,
    large: G,
    threshold: usize,
    side: HybridSide,
    registry: HashMap<RawFd, (Token, Interest)>,
    switches: u64,
    failed_upgrades: u64,
    /// The fd the large monitor refused: no upgrade is tried while it stays registered, so a
    /// doomed upgrade is not retried on every registration.
    refused_fd: Option<RawFd>,
}

impl<S: EventLoop, G: EventLoop> Hybrid<S, G> {
    /// A hybrid with QEMU's threshold of 64. Both monitors must be empty.
    pub fn new(small: S, large: G) -> Self {
        Self::with_threshold(small, large, DEFAULT_HYBRID_THRESHOLD)
    }

    /// A hybrid that moves to `large` at `threshold` registered fds (at least 1).
    pub fn with_threshold(small: S, large: G, threshold: usize) -> Self {
        Hybrid {
            small,
            large,
            threshold: threshold.max(1),
            side: HybridSide::Small,
            registry: HashMap::new(),
            switches: 0,
            failed_upgrades: 0,
            refused_fd: None,
        }
    }

    /// The active side.
    pub fn side(&self) -> HybridSide {
        self.side
    }

    /// How many times the registrations moved between monitors.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// How many upgrades were rolled back because the large monitor refused an fd.
    pub fn failed_upgrades(&self) -> u64 {
        self.failed_upgrades
    }

    fn active(&mut self) -> &mut dyn EventLoop {
        match self.side {
            HybridSide::Small => &mut self.small,
            HybridSide::Large => &mut self.large,
        }
    }

    fn maybe_upgrade(&mut self) {
        if self.side == HybridSide::Small
            && self.refused_fd.is_none()
            && self.registry.len() >= self.threshold
        {
            self.switch_to(HybridSide::Large);
        }
    }

    /// Moves every registration to the other monitor; on refusal, rolls back and stays.
    /// What removing `fd` changes: a refused fd no longer pins the small side, and a registry
    /// that fell under half the threshold goes back to it.
    fn after_removal(&mut self, fd: RawFd) {
        if self.refused_fd == Some(fd) {
            self.refused_fd = None;
            self.maybe_upgrade();
        }
        if self.side == HybridSide::Large && self.registry.len() < self.threshold / 2 {
            self.switch_to(HybridSide::Small);
        }
    }

    fn switch_to(&mut self, target: HybridSide) {
        if self.side == target {
            return;
        }
        let (from, to): (&mut dyn EventLoop, &mut dyn EventLoop) = match target {
            HybridSide::Large => (&mut self.small, &mut self.large),
            HybridSide::Small => (&mut self.large, &mut self.small),
        };
        let mut moved = Vec::with_capacity(self.registry.len());
        let mut refused = None;
        for (&fd, &(token, interest)) in &self.registry {
            // SAFETY: `fd` was registered with us and not deregistered; the `EventLoop`
            // contract has callers deregister an fd before they close it, so it is open. A
            // caller that breaks it gets `EBADF` below (handled) or a registration of whatever
            // file now has the number: the monitors only hand the number to the kernel and
            // never reach memory through it.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            match to.register(borrowed, token, interest) {
                Ok(()) => moved.push(fd),
                // Closed behind our back: nothing to move, the registry keeps it for deregister.
                Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
                Err(_) => {
                    refused = Some(fd);
                    break;
                }
            }
        }
        if refused.is_some() {
            for fd in moved {
                // SAFETY: as above; registered a moment ago.
                let _ = to.deregister(unsafe { BorrowedFd::borrow_raw(fd) });
            }
            self.failed_upgrades += 1;
            self.refused_fd = refused;
            return;
        }
        for &fd in self.registry.keys() {
            // SAFETY: as above.
            let _ = from.deregister(unsafe { BorrowedFd::borrow_raw(fd) });
        }
        self.side = target;
        self.switches += 1;
    }
}

impl<S: EventLoop, G: EventLoop> EventLoop for Hybrid<S, G> {
    fn name(&self) -> &'static str {
        "hybrid"
    }

    fn describe(&self) -> String {
        match self.side {
            HybridSide::Small => format!("hybrid({})", self.small.name()),
            HybridSide::Large => format!("hybrid({})", self.large.name()),
        }
    }

    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let raw = fd.as_raw_fd();
        if self.registry.contains_key(&raw) {
            return Err(aio_core::kit::already_registered(raw));
        }
        match self.active().register(fd, token, interest) {
            // The large monitor refuses this fd (epoll and a regular file): go back to the
            // small one, which takes anything, and stay there while this fd is registered.
            Err(e) if self.side == HybridSide::Large && e.raw_os_error() == Some(libc::EPERM) => {
                self.switch_to(HybridSide::Small);
                if self.side != HybridSide::Small {
                    return Err(e);
                }
                self.small.register(fd, token, interest)?;
                self.refused_fd = Some(raw);
            }
            other => other?,
        }
        self.registry.insert(raw, (token, interest));
        self.maybe_upgrade();
        Ok(())
    }

    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let raw = fd.as_raw_fd();
        let Some(entry) = self.registry.get(&raw).copied() else {
            return Err(aio_core::kit::not_registered(raw));
        };
        self.active().modify(fd, token, interest)?;
        if entry != (token, interest) {
            self.registry.insert(raw, (token, interest));
        }
        Ok(())
    }

    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let raw = fd.as_raw_fd();
        if self.registry.remove(&raw).is_none() {
            return Err(aio_core::kit::not_registered(raw));
        }
        let result = self.active().deregister(fd);
        self.after_removal(raw);
        result
    }

    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()> {
        if self.registry.remove(&fd).is_none() {
            return Err(aio_core::kit::not_registered(fd));
        }
        let result = self.active().forget_closed(fd);
        self.after_removal(fd);
        result
    }

    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        self.active().wait(timeout, events)
    }

    fn registered(&self) -> usize {
        self.registry.len()
    }

    fn needs_wait(&self) -> bool {
        match self.side {
            HybridSide::Small => self.small.needs_wait(),
            HybridSide::Large => self.large.needs_wait(),
        }
    }

    fn reports_closed_fds(&self) -> bool {
        match self.side {
            HybridSide::Small => self.small.reports_closed_fds(),
            HybridSide::Large => self.large.reports_closed_fds(),
        }
    }
}
