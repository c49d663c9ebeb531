//! Building submission entries: one SQE per in-flight slot, with the registered file and
//! registered buffer it may use.
//!
//! This module owns the translation of a prepared request into an `io_uring` entry and the
//! registrations that entry relies on (files and buffers registered on first use). It never
//! submits or reaps: that is the engine's (`mod.rs`).

use std::os::fd::RawFd;

use aio_core::kit::{Prepared, PreparedRw, RangeOp};
use io_uring::{opcode, squeue, types};

use super::slot_entry::SlotEntry;
use super::{UringEngine, REGISTERED_FILES};
use crate::ring::ENGINE_BIT;

/// Builds an entry on the file's registered index if it has one, on its fd otherwise (the
/// opcode builders take either type).
macro_rules! on_target {
    ($fixed:expr, $fd:expr, $build:expr) => {
        match $fixed {
            Some(i) => $build(types::Fixed(i)),
            None => $build(types::Fd($fd)),
        }
    };
}

impl UringEngine {
    /// The registered-buffer slot for `slot`'s buffer, registering it on first use (None:
    /// off, a vectored request or a sync, or every slot in use).
    pub(super) fn fixed_buffer(&mut self, slot: u32) -> Option<u16> {
        if let Some(Some(index)) = self.buffer_of.get(slot as usize) {
            // A resubmitted remainder keeps its slot.
            return Some(*index);
        }
        let table = self.buffers.as_mut()?;
        let buf = self.core.table.single_buffer(slot)?;
        let (ring, stats) = (&self.ring, &mut self.stats);
        let acquired = table.acquire(buf, |index, iovec| {
            // SAFETY: `iovec` covers the whole buffer of a live request, which stays in the
            // in-flight table (neither moved nor freed) until the request completes; the
            // kernel pins these pages now. The slot serves only requests whose buffer is this
            // same allocation (matched by id, never by address), so the kernel writes through
            // it only into a buffer that a request in flight owns. Once the allocation is
            // freed no request uses the slot again: the kernel merely keeps the old pages
            // pinned, without touching them, until the slot is replaced or the ring dropped.
            let registered = ring.with(|r| unsafe {
                r.submitter().register_buffers_update(
                    index as u32,
                    std::slice::from_ref(iovec),
                    None,
                )
            });
            if registered.is_ok() {
                stats.buffer_registrations += 1;
            }
            registered
        });
        match acquired {
            Ok(Some(index)) => {
                if self.buffer_of.len() <= slot as usize {
                    self.buffer_of.resize(slot as usize + 1, None);
                }
                self.buffer_of[slot as usize] = Some(index);
                Some(index)
            }
            Ok(None) => None,
            // Out of lockable memory (or not allowed): the next registration would be
            // refused too, so the table is off for good; in-flight users of registered
            // slots finish normally.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM)) => {
                self.buffers_error = Some(e);
                self.buffers = None;
                None
            }
            // Refused for this buffer only (EFAULT, EINVAL...): it goes without.
            Err(_) => {
                self.stats.buffer_registrations_refused += 1;
                None
            }
        }
    }

    /// `slot`'s request completed: its registered-buffer slot has one user less.
    pub(super) fn release_fixed_buffer(&mut self, slot: u32) {
        if let Some(index) = self.buffer_of.get_mut(slot as usize).and_then(Option::take) {
            if let Some(table) = self.buffers.as_mut() {
                table.release(index);
            }
        }
    }

    /// The registered index for `fd`, registering it on first use (None: plain fd).
    fn fixed_index(&mut self, slot: u32, fd: RawFd) -> Option<u32> {
        if !self.files_ready {
            return None;
        }
        if let Some((index, _)) = self.files.get(&fd) {
            return Some(*index);
        }
        let index = self.files.len() as u32;
        if index >= REGISTERED_FILES {
            return None;
        }
        self.ring
            .with(|r| r.submitter().register_files_update(index, &[fd]))
            .ok()?;
        // Keep the file open while it is registered, so its fd number cannot be reused.
        let file = self.core.table.file(slot)?;
        self.files.insert(fd, (index, file));
        Some(index)
    }

    /// The submission entry for `slot`, with the registrations it uses.
    pub(super) fn entry(&mut self, slot: u32) -> SlotEntry {
        let prepared = self.core.table.prepare(slot).expect("live slot");
        let fd = match prepared {
            Prepared::Sync { fd, .. }
            | Prepared::Rw(PreparedRw { fd, .. })
            | Prepared::Range { fd, .. } => fd,
        };
        let fixed = self.fixed_index(slot, fd);
        let mut fixed_buffer = false;
        let entry = match prepared {
            Prepared::Sync { datasync, .. } => {
                let flags = if datasync {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                on_target!(fixed, fd, |t| opcode::Fsync::new(t).flags(flags).build())
            }
            Prepared::Range {
                how, offset, len, ..
            } => match how {
                RangeOp::Fallocate { mode } => {
                    on_target!(fixed, fd, |t| opcode::Fallocate::new(t, len)
                        .offset(offset)
                        .mode(mode)
                        .build())
                }
                RangeOp::BlockDiscard => {
                    unreachable!("check_request refuses a block device's discard at submit")
                }
            },
            Prepared::Rw(rw) => {
                let (entry, registered) = self.rw_entry(slot, fixed, rw);
                fixed_buffer = registered;
                entry
            }
        };
        let tag = if self.is_shared() { ENGINE_BIT } else { 0 };
        SlotEntry {
            sqe: entry.user_data(tag | slot as u64),
            fixed_file: fixed.is_some(),
            fixed_buffer,
        }
    }

    /// A read or write: `READ_FIXED` / `WRITE_FIXED` for one buffer in a registered slot,
    /// `READ` / `WRITE` for one buffer otherwise, `READV` / `WRITEV` for several; and whether
    /// it uses a registered buffer.
    fn rw_entry(&mut self, slot: u32, fixed: Option<u32>, rw: PreparedRw) -> (squeue::Entry, bool) {
        let PreparedRw {
            fd,
            is_read,
            offset,
            iovecs,
            count,
            rw_flags,
        } = rw;
        // SAFETY: `iovecs` points to `count` >= 1 live iovecs in the table.
        let first_len = unsafe { (*iovecs).iov_len };
        if count > 1 || first_len > u32::MAX as usize {
            let entry = if is_read {
                on_target!(fixed, fd, |t| opcode::Readv::new(t, iovecs, count as u32)
                    .offset(offset)
                    .rw_flags(rw_flags)
                    .build())
            } else {
                on_target!(fixed, fd, |t| opcode::Writev::new(t, iovecs, count as u32)
                    .offset(offset)
                    .rw_flags(rw_flags)
                    .build())
            };
            return (entry, false);
        }
        // SAFETY: `iovecs` points to one live iovec in the table.
        let v = unsafe { *iovecs };
        let (base, len) = (v.iov_base.cast::<u8>(), v.iov_len as u32);
        // The remainder lies inside the registered whole buffer.
        let registered = self.fixed_buffer(slot);
        let entry = match (registered, is_read) {
            (Some(index), true) => {
                on_target!(fixed, fd, |t| opcode::ReadFixed::new(t, base, len, index)
                    .offset(offset)
                    .rw_flags(rw_flags)
                    .build())
            }
            (Some(index), false) => {
                on_target!(fixed, fd, |t| opcode::WriteFixed::new(t, base, len, index)
                    .offset(offset)
                    .rw_flags(rw_flags)
                    .build())
            }
            (None, true) => on_target!(fixed, fd, |t| opcode::Read::new(t, base, len)
                .offset(offset)
                .rw_flags(rw_flags)
                .build()),
            (None, false) => on_target!(fixed, fd, |t| opcode::Write::new(t, base, len)
                .offset(offset)
                .rw_flags(rw_flags)
                .build()),
        };
        (entry, registered.is_some())
    }
}

#[cfg(test)]
mod tests {
    use aio_conformance::engine::{TempFile, BLOCK};
    use io_uring::squeue;

    use crate::{UringConfig, UringEngine};

    /// The `rw_flags` word of an SQE (`__u32 rw_flags` at byte 28 of the kernel's 64-byte
    /// `struct io_uring_sqe`, the ABI every kernel keeps).
    fn sqe_rw_flags(sqe: &squeue::Entry) -> libc::c_int {
        assert_eq!(std::mem::size_of::<squeue::Entry>(), 64);
        // SAFETY: `squeue::Entry` is `#[repr(C)]` around the kernel's `io_uring_sqe` and
        // nothing else (64 bytes, checked above), a plain struct of integers every byte of
        // which is initialised (the builders start from a zeroed SQE); it is borrowed for
        // the read.
        let bytes = unsafe { &*(sqe as *const squeue::Entry).cast::<[u8; 64]>() };
        libc::c_int::from_ne_bytes(bytes[28..32].try_into().unwrap())
    }

    /// A request's flags are the SQE's `rw_flags`, on every entry an engine builds for a read
    /// or a write: `READ` / `WRITE`, `READ_FIXED` / `WRITE_FIXED` (registered buffers), and
    /// `READV` / `WRITEV`; a request without flags has none.
    #[test]
    fn request_flags_reach_the_sqe() {
        if aio_conformance::available("io_uring unavailable", crate::probe()).is_none() {
            return;
        }
        let tmp = TempFile::with_len(4 * BLOCK, 1);
        let file = tmp.open_direct_or_say();
        for fixed_buffers in [0, 8] {
            let config = UringConfig::default().with_fixed_buffers(fixed_buffers);
            let mut engine = UringEngine::new(config).unwrap();
            let cases = aio_conformance::engine::requests_with_rw_flags(&file);
            for (request, rwf) in cases {
                let token = request.token;
                // Built, never submitted: the table keeps the request until the engine drops.
                let slot = engine.core.table.insert(request);
                let entry = engine.entry(slot);
                assert_eq!(
                    sqe_rw_flags(&entry.sqe),
                    rwf,
                    "request {token}, fixed buffers {fixed_buffers}"
                );
                let single = !matches!(token, 5 | 6);
                assert_eq!(
                    entry.fixed_buffer,
                    fixed_buffers > 0 && single,
                    "request {token}"
                );
            }
        }
    }
}
