//! The io_uring fd monitor: an [`EventLoop`] over `IORING_OP_POLL_ADD`.
//!
//! This module owns the monitor's ring, its registrations and the mapping of poll completions
//! back to tokens. Each registered fd has at most one one-shot poll outstanding; a poll that
//! fired is re-armed at the next `wait`, which then reports the fd again if it is still ready:
//! level-triggered, as the contract requires (multishot polls report wake-ups, not states).
//! A poll's user data carries the fd and a generation, so a completion that arrives after its
//! registration was changed or removed is recognised and ignored: removal never leaves a
//! dangling reference, and nothing is freed before its completion (polls own no memory).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use aio_core::kit::ensure_new;
use aio_core::{Event, EventLoop, Interest, Token};
use std::cell::RefCell;
use std::rc::Rc;

use io_uring::{opcode, squeue, types, IoUring};

use crate::engine::{check_config, UringConfig, UringEngine, MAX_ENTRIES};
use crate::probe::{classify, UringUnavailable};
use crate::ring::{drain_cq, RingHandle, SharedCore};
use crate::task_run::{build_ring, TaskRun};

// Generation 0 is never given to a registration, and bit 63 stays clear (on a shared ring it
// marks the engine's entries), so neither value can be a poll's user data.
const TIMEOUT_DATA: u64 = 0xFFFF_FFFF;
const REMOVE_DATA: u64 = 0xFFFF_FFFE;
/// Generations use 31 bits (bit 63 of the user data belongs to the engine on a shared ring).
const GENERATION_MASK: u32 = 0x7FFF_FFFF;

#[derive(Debug, Clone, Copy)]
struct Registration {
    token: Token,
    interest: Interest,
    generation: u32,
    /// A poll for this generation is with the kernel.
    armed: bool,
    /// The kernel said the fd is gone (`-EBADF`): nothing more to watch.
    dead: bool,
}

fn user_data(fd: RawFd, generation: u32) -> u64 {
    ((generation as u64) << 32) | fd as u32 as u64
}

/// The io_uring poll monitor: an [`EventLoop`] over `IORING_OP_POLL_ADD`.
///
/// Each registered fd has at most one one-shot poll outstanding; a poll that fired is re-armed
/// at the next `wait`, which reports the fd again if it is still ready (level-triggered, as the
/// contract requires). A completion that arrives after its registration was changed or removed
/// is recognised by its generation and ignored, so removal is safe while a poll is outstanding.
///
/// `!Send`, for the same reasons as [`UringEngine`]: build it on the loop's
/// thread.
pub struct UringLoop {
    ring: RingHandle,
    registrations: HashMap<RawFd, Registration>,
    to_arm: Vec<RawFd>,
    next_generation: u32,
}

impl std::fmt::Debug for UringLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringLoop")
            .field("registered", &self.registrations.len())
            .finish_non_exhaustive()
    }
}

impl UringLoop {
    /// A monitor with a 256-entry ring (1024 completions), with deferred task work where the
    /// kernel has it ([`TaskRun::Auto`]): poll completions are posted by the monitor's own
    /// waits, never by interrupting the loop.
    pub fn new() -> Result<Self, UringUnavailable> {
        let (ring, _) = Self::build_ring(256, TaskRun::Auto)?;
        Ok(Self::on(RingHandle::Own(Box::new(ring))))
    }

    fn build_ring(entries: u32, task_run: TaskRun) -> Result<(IoUring, TaskRun), UringUnavailable> {
        // Polls and block I/O share the CQ: four completions per entry, within the kernel's
        // CQ limit (twice IORING_MAX_ENTRIES).
        let cq = (u64::from(entries.max(256)) * 4).min(2 * u64::from(MAX_ENTRIES)) as u32;
        build_ring(entries.max(1), cq, task_run).map_err(classify)
    }

    fn on(ring: RingHandle) -> Self {
        UringLoop {
            ring,
            registrations: HashMap::new(),
            to_arm: Vec::new(),
            next_generation: 1,
        }
    }

    /// Whether this monitor shares its ring with an engine.
    pub fn is_shared(&self) -> bool {
        matches!(self.ring, RingHandle::Shared(_))
    }

    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: poll, poll-remove and timeout entries reference no memory except the
        // timespec of a TIMEOUT, which the caller keeps alive until the next enter.
        unsafe { self.ring.push(entry) }
    }

    fn remove_poll(&mut self, fd: RawFd, reg: &Registration) -> io::Result<()> {
        if reg.armed {
            let entry = opcode::PollRemove::new(user_data(fd, reg.generation))
                .build()
                .user_data(REMOVE_DATA);
            self.push(&entry)?;
        }
        Ok(())
    }

    /// Records a (new or changed) registration under a fresh generation and queues its poll
    /// for the next wait; completions of older generations are ignored from now on.
    fn arm_new(&mut self, fd: RawFd, token: Token, interest: Interest, dead: bool) {
        let generation = self.new_generation();
        self.registrations.insert(
            fd,
            Registration {
                token,
                interest,
                generation,
                armed: false,
                dead,
            },
        );
        self.to_arm.push(fd);
    }

    fn new_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = (self.next_generation.wrapping_add(1) & GENERATION_MASK).max(1);
        g
    }

    fn arm_pending(&mut self) -> io::Result<()> {
        let fds = std::mem::take(&mut self.to_arm);
        for (i, &fd) in fds.iter().enumerate() {
            let Some(reg) = self.registrations.get(&fd).copied() else {
                continue;
            };
            if reg.armed || reg.dead {
                continue;
            }
            let mut mask = 0u32;
            if reg.interest.is_readable() {
                mask |= (libc::POLLIN | libc::POLLRDHUP) as u32;
            }
            if reg.interest.is_writable() {
                mask |= libc::POLLOUT as u32;
            }
            let entry = opcode::PollAdd::new(types::Fd(fd), mask)
                .build()
                .user_data(user_data(fd, reg.generation));
            if let Err(e) = self.push(&entry) {
                // Keep this fd and the rest for the next wait: readiness must not be lost.
                self.to_arm.extend_from_slice(&fds[i..]);
                return Err(e);
            }
            if let Some(r) = self.registrations.get_mut(&fd) {
                r.armed = true;
            }
        }
        Ok(())
    }

    fn collect(&mut self, events: &mut Vec<Event>) {
        let mut results: Vec<(u64, i32)> = Vec::new();
        let mut engine_ready = None;
        match &mut self.ring {
            RingHandle::Own(ring) => {
                drain_cq(ring, |data, res| results.push((data, res)));
            }
            RingHandle::Shared(core) => {
                let mut core = core.borrow_mut();
                core.drain();
                results.append(&mut core.poll_results);
                if core.engine_ready() {
                    engine_ready = core.engine_fd;
                }
            }
        }
        for (data, res) in results {
            if data == TIMEOUT_DATA || data == REMOVE_DATA {
                continue;
            }
            let fd = data as u32 as RawFd;
            let generation = (data >> 32) as u32;
            let Some(reg) = self.registrations.get_mut(&fd) else {
                continue;
            };
            if reg.generation != generation {
                continue; // a poll of an older registration
            }
            reg.armed = false;
            if res == -libc::EBADF {
                reg.dead = true;
                continue;
            }
            self.to_arm.push(fd);
            if res >= 0 {
                events.push(Event::from_poll_bits(reg.token, res as u32));
            }
        }
        // Shared ring: the engine's completions arrived here; report its notifier readable so
        // the context runs the engine's handler (no eventfd write was needed).
        if let Some(fd) = engine_ready {
            if let Some(reg) = self.registrations.get(&fd) {
                events.push(Event {
                    token: reg.token,
                    readable: true,
                    writable: false,
                    invalid: false,
                });
            }
        }
    }

    /// Whether results are already waiting (shared ring: drained by the engine).
    fn pending(&self) -> bool {
        match &self.ring {
            RingHandle::Own(_) => false,
            RingHandle::Shared(core) => {
                let core = core.borrow();
                !core.poll_results.is_empty() || core.engine_ready()
            }
        }
    }
}

/// One io_uring for both the fd monitor and block I/O (QEMU's newest design): the engine's
/// completions arrive in the completion queue the monitor waits on, so they need no eventfd
/// and no extra wakeup. Use the monitor for the `AioContext` (`aio-loop`) and
/// attach the engine to that same context.
///
/// The ring runs in [`UringConfig::task_run`]'s mode; with the flag modes (the default), the
/// engine's `io_poll` check sees completions the kernel still holds as task work.
pub fn shared_ring(config: UringConfig) -> Result<(UringLoop, UringEngine), UringUnavailable> {
    // Refused settings say so before a ring is set up.
    check_config(&config)?;
    let (ring, task_run) = UringLoop::build_ring(config.entries, config.task_run)?;
    let core = Rc::new(RefCell::new(SharedCore {
        ring,
        io_results: Vec::new(),
        poll_results: Vec::new(),
        engine_fd: None,
        engine_kick: false,
    }));
    let engine = UringEngine::on_shared(core.clone(), config, task_run)?;
    Ok((UringLoop::on(RingHandle::Shared(core)), engine))
}

impl EventLoop for UringLoop {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn register(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let fd = ensure_new(fd, |fd| self.registrations.contains_key(&fd))?;
        self.arm_new(fd, token, interest, false);
        Ok(())
    }

    fn modify(&mut self, fd: BorrowedFd<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let fd = fd.as_raw_fd();
        let Some(reg) = self.registrations.get(&fd).copied() else {
            return Err(aio_core::kit::not_registered(fd));
        };
        self.remove_poll(fd, &reg)?;
        self.arm_new(fd, token, interest, reg.dead);
        Ok(())
    }

    fn deregister(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.forget_closed(fd.as_raw_fd())
    }

    fn forget_closed(&mut self, fd: RawFd) -> io::Result<()> {
        // A poll is cancelled by its user data, never through the fd number.
        let Some(reg) = self.registrations.remove(&fd) else {
            return Err(aio_core::kit::not_registered(fd));
        };
        // Its poll (if any) is cancelled; the completion that follows has a generation no
        // registration has any more and is ignored.
        self.remove_poll(fd, &reg)
    }

    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        self.arm_pending()?;
        // Results the engine already drained from a shared ring: do not sleep on them.
        let timeout = if self.pending() {
            Some(Duration::ZERO)
        } else {
            timeout
        };
        let result = match timeout {
            Some(t) if t.is_zero() => self.ring.with(|r| r.submit()).map(drop),
            None => self.ring.with(|r| r.submit_and_wait(1)).map(drop),
            Some(t) => {
                let ts = types::Timespec::from(t.min(Duration::from_secs(i64::MAX as u64 / 2)));
                if self.ring.with(|r| r.params().is_feature_ext_arg()) {
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring
                        .with(|r| r.submitter().submit_with_args(1, &args))
                        .map(drop)
                } else {
                    let entry = opcode::Timeout::new(&ts).build().user_data(TIMEOUT_DATA);
                    self.push(&entry)?;
                    self.ring.with(|r| r.submit_and_wait(1)).map(drop)
                }
            }
        };
        match result {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
            Err(e) => {
                // EINTR included: report it (the context retries); collect what arrived.
                self.collect(events);
                return if events.is_empty() { Err(e) } else { Ok(()) };
            }
        }
        self.collect(events);
        Ok(())
    }

    fn needs_wait(&self) -> bool {
        // Polls to (re)arm, or results a shared ring's engine already drained: only a wait
        // hands them over (QEMU's io_uring monitor stops polling for its submit list too).
        if !self.to_arm.is_empty() || self.pending() {
            return true;
        }
        self.ring.with(|r| {
            // SAFETY: transient views of the SQ and CQ; no SubmissionQueue or CompletionQueue
            // is alive meanwhile (every method that makes one drops it before returning, and
            // the ring is `!Send`, used on this thread only).
            let sq = unsafe { r.submission_shared() };
            // SAFETY: as above.
            let cq = unsafe { r.completion_shared() };
            !sq.is_empty() || sq.taskrun() || !cq.is_empty()
        })
    }

    fn registered(&self) -> usize {
        self.registrations.len()
    }
}
