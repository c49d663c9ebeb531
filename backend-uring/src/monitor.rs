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
use std::os::fd::RawFd;
use std::time::Duration;

use aio_core::{Event, EventLoop, Interest, Token};
use io_uring::{opcode, squeue, types, IoUring};

use crate::probe::{classify, UringUnavailable};

const TIMEOUT_DATA: u64 = u64::MAX;
const REMOVE_DATA: u64 = u64::MAX - 1;

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

/// The io_uring poll monitor. See the [module docs](self).
pub struct UringLoop {
    ring: IoUring,
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
    /// A monitor with a 256-entry ring (1024 completions).
    pub fn new() -> Result<Self, UringUnavailable> {
        let ring = IoUring::builder()
            .setup_cqsize(1024)
            .build(256)
            .map_err(classify)?;
        Ok(UringLoop {
            ring,
            registrations: HashMap::new(),
            to_arm: Vec::new(),
            next_generation: 1,
        })
    }

    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: poll, poll-remove and timeout entries reference no memory except the
            // timespec of a TIMEOUT, which the caller keeps alive until the next enter.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            // Full: hand what is queued to the kernel and try again.
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
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

    fn new_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        g
    }

    fn arm_pending(&mut self) -> io::Result<()> {
        let fds = std::mem::take(&mut self.to_arm);
        for fd in fds {
            let Some(reg) = self.registrations.get(&fd).copied() else {
                continue;
            };
            if reg.armed || reg.dead {
                continue;
            }
            let mut mask = 0u32;
            if reg.interest.readable {
                mask |= (libc::POLLIN | libc::POLLRDHUP) as u32;
            }
            if reg.interest.writable {
                mask |= libc::POLLOUT as u32;
            }
            let entry = opcode::PollAdd::new(types::Fd(fd), mask)
                .build()
                .user_data(user_data(fd, reg.generation));
            self.push(&entry)?;
            if let Some(r) = self.registrations.get_mut(&fd) {
                r.armed = true;
            }
        }
        Ok(())
    }

    fn collect(&mut self, events: &mut Vec<Event>) {
        loop {
            let mut results: Vec<(u64, i32)> = Vec::new();
            for cqe in self.ring.completion() {
                results.push((cqe.user_data(), cqe.result()));
            }
            let got = results.len();
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
                if res < 0 {
                    // -ECANCELED and similar: re-arm and let the next wait tell.
                    self.to_arm.push(fd);
                    continue;
                }
                self.to_arm.push(fd);
                events.push(Event::from_poll_bits(reg.token, res as u32));
            }
            // SAFETY: a transient view of the SQ flags.
            let overflow = unsafe { self.ring.submission_shared() }.cq_overflow();
            if overflow {
                let _ = self.ring.submit();
                continue;
            }
            if got == 0 {
                return;
            }
        }
    }
}

impl EventLoop for UringLoop {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn register(&mut self, fd: RawFd, token: Token, interest: Interest) -> io::Result<()> {
        if fd < 0 {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        if self.registrations.contains_key(&fd) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("fd {fd} is already registered"),
            ));
        }
        let generation = self.new_generation();
        self.registrations.insert(
            fd,
            Registration {
                token,
                interest,
                generation,
                armed: false,
                dead: false,
            },
        );
        self.to_arm.push(fd);
        Ok(())
    }

    fn modify(&mut self, fd: RawFd, token: Token, interest: Interest) -> io::Result<()> {
        let Some(reg) = self.registrations.get(&fd).copied() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("fd {fd} is not registered"),
            ));
        };
        self.remove_poll(fd, &reg)?;
        let generation = self.new_generation();
        self.registrations.insert(
            fd,
            Registration {
                token,
                interest,
                generation,
                armed: false,
                dead: reg.dead,
            },
        );
        self.to_arm.push(fd);
        Ok(())
    }

    fn deregister(&mut self, fd: RawFd) -> io::Result<()> {
        let Some(reg) = self.registrations.remove(&fd) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("fd {fd} is not registered"),
            ));
        };
        // Its poll (if any) is cancelled; the completion that follows has a generation no
        // registration has any more and is ignored.
        self.remove_poll(fd, &reg)
    }

    fn wait(&mut self, timeout: Option<Duration>, events: &mut Vec<Event>) -> io::Result<()> {
        self.arm_pending()?;
        let result = match timeout {
            Some(t) if t.is_zero() => self.ring.submit().map(drop),
            None => self.ring.submit_and_wait(1).map(drop),
            Some(t) => {
                let ts = types::Timespec::from(t.min(Duration::from_secs(i64::MAX as u64 / 2)));
                if self.ring.params().is_feature_ext_arg() {
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args).map(drop)
                } else {
                    let entry = opcode::Timeout::new(&ts).build().user_data(TIMEOUT_DATA);
                    self.push(&entry)?;
                    self.ring.submit_and_wait(1).map(drop)
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

    fn registered(&self) -> usize {
        self.registrations.len()
    }
}
