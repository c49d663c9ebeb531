//! Registered (fixed) buffers: which allocation each slot of the ring's buffer table holds.
//!
//! This module owns the bookkeeping of the engine's sparse buffer table
//! (`IORING_REGISTER_BUFFERS2` with `IORING_RSRC_REGISTER_SPARSE`): which buffer allocation
//! each slot holds and how many in-flight requests use it. A buffer is registered on its first
//! use (one `io_uring_register` call, through the closure the engine passes, which pins its
//! pages), its slot is reused while requests bring the same allocation back, and an idle slot
//! is replaced when the table is full. It never frees or touches buffer memory and never builds
//! submission entries (the engine does).
//!
//! Slots are keyed by [`AlignedBuf::id`](aio_core::engine::AlignedBuf::id), never by address:
//! a buffer allocated where a freed one was has another id, so it is registered anew and never
//! served by the pages pinned for its predecessor.

use std::collections::HashMap;
use std::io;

use aio_core::kit::WholeBuffer;

/// The kernel's limit on registered buffers (`IORING_MAX_REG_BUFFERS`).
pub const MAX_REGISTERED_BUFFERS: u32 = 1 << 14;

/// The kernel's limit on one registered buffer (1 GiB); larger ones go without.
const MAX_BUFFER_LEN: usize = 1 << 30;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The allocation registered here (0: none yet).
    id: u64,
    /// In-flight requests using it; a slot in use is never replaced.
    users: u32,
}

/// The engine's registered-buffer table.
#[derive(Debug)]
pub(crate) struct RegisteredBuffers {
    slots: Vec<Slot>,
    by_id: HashMap<u64, u16>,
    /// Where the search for a slot to replace starts (round robin).
    hand: usize,
}

impl RegisteredBuffers {
    /// A table of `n` empty slots (`1..=MAX_REGISTERED_BUFFERS`), matching the sparse table
    /// registered with the ring.
    pub(crate) fn new(n: u32) -> Self {
        RegisteredBuffers {
            slots: vec![Slot::default(); n as usize],
            by_id: HashMap::new(),
            hand: 0,
        }
    }

    /// The slot holding `buf` for one more request. Registers it (with `register(slot,
    /// iovec)`) in an empty or idle slot if it has none. `Ok(None)`: every slot is in use, so
    /// this request goes without a registered buffer. An error from `register` is returned
    /// and changes nothing.
    pub(crate) fn acquire(
        &mut self,
        buf: WholeBuffer,
        register: impl FnOnce(u16, &libc::iovec) -> io::Result<()>,
    ) -> io::Result<Option<u16>> {
        if let Some(&index) = self.by_id.get(&buf.id) {
            self.slots[index as usize].users += 1;
            return Ok(Some(index));
        }
        if buf.len == 0 || buf.len > MAX_BUFFER_LEN {
            return Ok(None);
        }
        let n = self.slots.len();
        let Some(index) = (0..n)
            .map(|i| (self.hand + i) % n)
            .find(|&i| self.slots[i].users == 0)
        else {
            return Ok(None);
        };
        let iovec = libc::iovec {
            iov_base: buf.ptr as *mut libc::c_void,
            iov_len: buf.len,
        };
        register(index as u16, &iovec)?;
        let old = std::mem::replace(
            &mut self.slots[index],
            Slot {
                id: buf.id,
                users: 1,
            },
        );
        if old.id != 0 {
            self.by_id.remove(&old.id);
        }
        self.by_id.insert(buf.id, index as u16);
        self.hand = (index + 1) % n;
        Ok(Some(index as u16))
    }

    /// A request that used `index` completed.
    pub(crate) fn release(&mut self, index: u16) {
        let slot = &mut self.slots[index as usize];
        slot.users = slot.users.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio_core::engine::AlignedBuf;

    fn whole(b: &AlignedBuf) -> WholeBuffer {
        WholeBuffer {
            id: b.id(),
            ptr: b.as_ptr(),
            len: b.len(),
        }
    }

    #[test]
    fn a_buffer_keeps_its_slot_and_busy_slots_are_never_replaced() {
        let mut table = RegisteredBuffers::new(2);
        let mut calls = Vec::new();
        let (a, b, c) = (
            AlignedBuf::new(4096),
            AlignedBuf::new(4096),
            AlignedBuf::new(4096),
        );
        let mut reg = |i: u16, v: &libc::iovec| {
            calls.push((i, v.iov_base as usize, v.iov_len));
            Ok(())
        };
        assert_eq!(table.acquire(whole(&a), &mut reg).unwrap(), Some(0));
        assert_eq!(
            table.acquire(whole(&a), &mut reg).unwrap(),
            Some(0),
            "reused"
        );
        assert_eq!(table.acquire(whole(&b), &mut reg).unwrap(), Some(1));
        assert_eq!(
            table.acquire(whole(&c), &mut reg).unwrap(),
            None,
            "both slots in use: c goes without"
        );
        table.release(1);
        assert_eq!(
            table.acquire(whole(&c), &mut reg).unwrap(),
            Some(1),
            "b's idle slot"
        );
        table.release(0);
        assert_eq!(
            table.acquire(whole(&a), &mut reg).unwrap(),
            Some(0),
            "a still registered"
        );
        assert_eq!(
            calls,
            [
                (0, a.as_ptr() as usize, 4096),
                (1, b.as_ptr() as usize, 4096),
                (1, c.as_ptr() as usize, 4096)
            ]
        );
        assert_eq!(
            table.acquire(whole(&b), |_, _| Ok(())).unwrap(),
            None,
            "b lost its slot to c, and both slots are in use again"
        );
    }

    #[test]
    fn a_refused_registration_changes_nothing() {
        let mut table = RegisteredBuffers::new(1);
        let a = AlignedBuf::new(4096);
        let refused = table.acquire(whole(&a), |_, _| {
            Err(io::Error::from_raw_os_error(libc::ENOMEM))
        });
        assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(table.acquire(whole(&a), |_, _| Ok(())).unwrap(), Some(0));
        assert_eq!(
            table
                .acquire(whole(&AlignedBuf::new(0)), |_, _| Ok(()))
                .unwrap(),
            None,
            "an empty buffer is never registered"
        );
        let huge = WholeBuffer {
            id: u64::MAX,
            ptr: std::ptr::null(),
            len: MAX_BUFFER_LEN + 1,
        };
        assert_eq!(
            table
                .acquire(huge, |_, _| panic!("never registered"))
                .unwrap(),
            None,
            "over the kernel's 1 GiB per buffer"
        );
    }
}
