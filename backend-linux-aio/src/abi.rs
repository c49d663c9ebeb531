//! The kernel's Linux AIO interface: structures, constants, raw syscalls and the completion
//! ring that `io_setup` maps into user space.
//!
//! This module owns every `unsafe` line of the crate that talks to the kernel. It knows the
//! ABI and nothing about requests, queues or the engine contract.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

/// `aio_context_t`: the address of the completion ring the kernel mapped for us.
pub type AioContextId = libc::c_ulong;

/// `IOCB_CMD_PREAD`.
pub const IOCB_CMD_PREAD: u16 = 0;
/// `IOCB_CMD_PWRITE`.
pub const IOCB_CMD_PWRITE: u16 = 1;
/// `IOCB_CMD_FSYNC`.
pub const IOCB_CMD_FSYNC: u16 = 2;
/// `IOCB_CMD_FDSYNC`.
pub const IOCB_CMD_FDSYNC: u16 = 3;
/// `IOCB_CMD_PREADV`.
pub const IOCB_CMD_PREADV: u16 = 7;
/// `IOCB_CMD_PWRITEV`.
pub const IOCB_CMD_PWRITEV: u16 = 8;
/// `IOCB_FLAG_RESFD`: signal `aio_resfd` (an eventfd) on completion.
pub const IOCB_FLAG_RESFD: u32 = 1;
/// `AIO_RING_MAGIC`: the ring header layout this module reads.
pub const AIO_RING_MAGIC: u32 = 0xa10a_10a1;

/// `struct iocb` (64 bytes; little-endian field order of `aio_key` / `aio_rw_flags`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Iocb {
    /// Returned in `io_event::data`.
    pub aio_data: u64,
    /// Kernel-internal key.
    pub aio_key: u32,
    /// `RWF_*` flags.
    pub aio_rw_flags: i32,
    /// `IOCB_CMD_*`.
    pub aio_lio_opcode: u16,
    /// Request priority.
    pub aio_reqprio: i16,
    /// The file.
    pub aio_fildes: u32,
    /// Buffer address (or iovec array address for the vectored commands).
    pub aio_buf: u64,
    /// Byte count (or iovec count).
    pub aio_nbytes: u64,
    /// File offset.
    pub aio_offset: i64,
    /// Reserved.
    pub aio_reserved2: u64,
    /// `IOCB_FLAG_*`.
    pub aio_flags: u32,
    /// The eventfd signalled with `IOCB_FLAG_RESFD`.
    pub aio_resfd: u32,
}

/// `struct io_event` (32 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct IoEvent {
    /// The iocb's `aio_data`.
    pub data: u64,
    /// The iocb's user address.
    pub obj: u64,
    /// Bytes transferred, or `-errno`.
    pub res: i64,
    /// Secondary result.
    pub res2: i64,
}

/// The header of the ring at the context address (`struct aio_ring` in fs/aio.c).
#[repr(C)]
struct RingHeader {
    id: u32,
    nr: u32,
    head: AtomicU32,
    tail: AtomicU32,
    magic: u32,
    compat_features: u32,
    incompat_features: u32,
    header_length: u32,
}

fn cvt_long(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `io_setup(nr_events)`.
pub fn io_setup(nr_events: u32) -> io::Result<AioContextId> {
    let mut id: AioContextId = 0;
    // SAFETY: `id` is a valid, writable aio_context_t that must be 0 on entry.
    cvt_long(unsafe { libc::syscall(libc::SYS_io_setup, nr_events, &mut id) })?;
    Ok(id)
}

/// `io_destroy(ctx)`: cancels what it can and waits for the rest.
pub fn io_destroy(id: AioContextId) -> io::Result<()> {
    // SAFETY: `id` came from io_setup and is destroyed once, by the engine's Drop.
    cvt_long(unsafe { libc::syscall(libc::SYS_io_destroy, id) }).map(|_| ())
}

/// `io_submit(ctx, iocbs)`: returns how many were accepted (a prefix of `iocbs`).
///
/// # Safety
/// Every iocb's buffer (or iovec array and the buffers it points to) must stay valid, and not
/// be touched by safe code, until its completion event has been reaped. The kernel copies the
/// iocbs and iovec arrays themselves during the call.
pub unsafe fn io_submit(id: AioContextId, iocbs: &mut [*mut Iocb]) -> io::Result<usize> {
    // SAFETY: `iocbs` is a live array of pointers to live iocbs; the caller upholds the buffer
    // contract above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_submit,
            id,
            iocbs.len() as libc::c_long,
            iocbs.as_mut_ptr(),
        )
    };
    cvt_long(r).map(|n| n as usize)
}

/// `io_getevents(ctx, min, events.len(), events, timeout)`; `None` blocks until `min`.
pub fn io_getevents(
    id: AioContextId,
    min: usize,
    events: &mut [IoEvent],
    timeout: Option<libc::timespec>,
) -> io::Result<usize> {
    let ts_ptr = aio_core::kit::timespec_ptr(timeout.as_ref());
    // SAFETY: `events` is writable for its length; `ts_ptr` is null or points to a live timespec.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_getevents,
            id,
            min as libc::c_long,
            events.len() as libc::c_long,
            events.as_mut_ptr(),
            ts_ptr,
        )
    };
    cvt_long(r).map(|n| n as usize)
}

/// The completion ring mapped at the context address, read without syscalls.
#[derive(Debug)]
pub struct Ring {
    header: *const RingHeader,
    events: *const IoEvent,
    nr: u32,
}

impl Ring {
    /// Views the ring of `id` if its header is the layout this module knows; `None` means
    /// "use io_getevents".
    ///
    /// # Safety
    /// `id` must be a live context from `io_setup`; the `Ring` must not outlive it.
    pub unsafe fn new(id: AioContextId) -> Option<Ring> {
        let header = id as *const RingHeader;
        if header.is_null() {
            return None;
        }
        // SAFETY: the kernel maps the ring (header plus events) at the context address for the
        // context's lifetime; the header fields read here are written once by io_setup.
        let (magic, incompat, nr, len) = unsafe {
            (
                (*header).magic,
                (*header).incompat_features,
                (*header).nr,
                (*header).header_length,
            )
        };
        if magic != AIO_RING_MAGIC
            || incompat != 0
            || nr == 0
            || len as usize != std::mem::size_of::<RingHeader>()
        {
            return None;
        }
        Some(Ring {
            header,
            // SAFETY: the events array follows the 32-byte header in the same mapping.
            events: unsafe { header.add(1) } as *const IoEvent,
            nr,
        })
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: valid for the context's lifetime (see `new`); head/tail are atomics.
        unsafe { &*self.header }
    }

    /// Whether completions are waiting (two loads, no syscall).
    pub fn has_events(&self) -> bool {
        let h = self.header();
        h.head.load(Ordering::Relaxed) != h.tail.load(Ordering::Acquire)
    }

    /// Moves up to `max` waiting events into `out` and releases their slots to the kernel.
    pub fn reap(&self, out: &mut Vec<IoEvent>, max: usize) -> usize {
        let h = self.header();
        let mut head = h.head.load(Ordering::Relaxed);
        // Acquire: the events up to `tail` are fully written before we read them.
        let tail = h.tail.load(Ordering::Acquire);
        let mut n = 0;
        while head != tail && n < max {
            let index = (head % self.nr) as usize;
            // SAFETY: `index < nr`, inside the mapped events array; the kernel does not touch
            // slots between head and tail until we move head past them.
            out.push(unsafe { std::ptr::read_volatile(self.events.add(index)) });
            head = (head + 1) % self.nr;
            n += 1;
        }
        if n > 0 {
            // Release: our reads of the events happen before the kernel may reuse the slots.
            h.head.store(head, Ordering::Release);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes() {
        assert_eq!(std::mem::size_of::<Iocb>(), 64);
        assert_eq!(std::mem::size_of::<IoEvent>(), 32);
        assert_eq!(std::mem::size_of::<RingHeader>(), 32);
    }
}
