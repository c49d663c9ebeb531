//! An in-process split-ring driver: the guest's side of one virtio-blk queue, in memory this
//! process maps, as a VMM's vCPUs would drive the device (descriptors and the avail ring
//! written in guest memory, the kick eventfd rung, the call eventfd waited on, the used ring
//! reaped). For tests, benchmarks and examples that run the real device without a guest.
//!
//! This module owns the guest side only: the ring layout (VIRTIO 1.2, 2.7 "Split
//! Virtqueues"), one request per slot (header, data, status: three descriptors, a `data_bytes`
//! buffer aligned to 4 KiB so that `O_DIRECT` needs no bounce) and the notification rules
//! (a kick only when the device has not set `VRING_USED_F_NO_NOTIFY`). The device side is
//! [`DeviceSide`]: what a transport hands to [`VirtioBlkQueue::start`].
//!
//! [`VirtioBlkQueue::start`]: crate::queue::VirtioBlkQueue::start

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::queue::GuestMemory;
use crate::spec;

/// Why a driver could not be set up or a request posted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The queue size is not a power of two in 4..=32768, or fewer than 3 descriptors per
    /// slot.
    #[error("queue size {size} with {slots} slots: the size must be a power of two from 4 to 32768, with 3 descriptors per slot")]
    BadSize {
        /// The queue size asked for.
        size: u16,
        /// The slots asked for.
        slots: u16,
    },
    /// The guest memory or an eventfd could not be created.
    #[error("setting up the driver: {0}")]
    Setup(#[source] io::Error),
    /// A slot out of range, or a request larger than a slot's buffer.
    #[error("slot {slot}: {reason}")]
    BadRequest {
        /// The slot.
        slot: u16,
        /// Why.
        reason: &'static str,
    },
    /// Guest memory could not be written (never for memory this driver mapped).
    #[error("guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
}

/// What the device side of the queue needs, as a transport would hand it over.
#[derive(Debug)]
pub struct DeviceSide {
    /// The queue, set up and ready (size, ring addresses, next avail 0).
    pub queue: Queue,
    /// The guest memory.
    pub memory: GuestMemory,
    /// The kick eventfd the device reads.
    pub kick: File,
    /// The call eventfd (the interrupt) the device writes.
    pub call: File,
}

/// One request as the driver posts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverRequest {
    /// `VIRTIO_BLK_T_*` ([`spec::T_IN`], [`spec::T_OUT`], ...).
    pub kind: u32,
    /// The first 512-byte sector.
    pub sector: u64,
    /// The data's length in bytes (0 for `FLUSH`; the slot's buffer holds at most
    /// [`SplitRingDriver::data_bytes`]).
    pub len: u32,
}

/// A finished request as the used ring gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// The slot it was posted in.
    pub slot: u16,
    /// Its status byte ([`spec::S_OK`], ...).
    pub status: u8,
    /// The bytes the device wrote, status included.
    pub written: u32,
}

const DESC_BYTES: u64 = 16;
const SLOT_META_BYTES: u64 = 32;
const PAGE: u64 = 4096;

/// The driver of one split virtqueue. `Send`: it can run on its own thread, as a vCPU.
#[derive(Debug)]
pub struct SplitRingDriver {
    memory: GuestMemory,
    size: u16,
    slots: u16,
    data_bytes: u32,
    /// Bytes between one slot's buffer and the next.
    stride: u64,
    /// Where a slot's buffer starts past its 4 KiB boundary.
    data_offset: u32,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    meta: GuestAddress,
    data: GuestAddress,
    next_avail: u16,
    next_used: u16,
    kick: File,
    call: File,
}

/// A new non-blocking eventfd, as a `File` (what a transport hands the queue as its kick and
/// call fds).
pub(crate) fn eventfd() -> io::Result<File> {
    let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    Ok(File::from(OwnedFd::from(fd)))
}

fn align(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// Where a ring of `size` with `slots` slots laid out from `base` (the descriptor table) has
/// its avail ring, used ring, slots' headers and first data buffer, and the bytes from one
/// data buffer to the next.
fn layout(
    base: u64,
    size: u16,
    slots: u16,
    data_bytes: u32,
    data_offset: u32,
) -> (u64, u64, u64, u64, u64) {
    let n = u64::from(size);
    let avail = base + DESC_BYTES * n;
    let used = align(avail + 6 + 2 * n, 4);
    let meta = align(used + 6 + 8 * n, PAGE);
    let data = align(meta + SLOT_META_BYTES * u64::from(slots), PAGE);
    let stride = align(
        u64::from(data_bytes).max(1) + u64::from(data_offset % PAGE as u32),
        PAGE,
    );
    (avail, used, meta, data, stride)
}

impl SplitRingDriver {
    /// A queue of `size` descriptors with `slots` request slots (at most `size / 3`), each
    /// with a `data_bytes` buffer aligned to 4 KiB, in fresh guest memory; and the device's
    /// side of it.
    pub fn new(size: u16, slots: u16, data_bytes: u32) -> Result<(Self, DeviceSide), DriverError> {
        Self::with_data_offset(size, slots, data_bytes, 0)
    }

    /// As [`new`](Self::new), with each slot's buffer starting `data_offset` bytes past its
    /// 4 KiB boundary: a driver whose buffers are not aligned for `O_DIRECT` (the device then
    /// copies through its bounce buffers, as QEMU does for such a guest).
    pub fn with_data_offset(
        size: u16,
        slots: u16,
        data_bytes: u32,
        data_offset: u32,
    ) -> Result<(Self, DeviceSide), DriverError> {
        let total = Self::memory_bytes(size, slots, data_bytes, data_offset)?;
        let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), total as usize)])
            .map_err(|e| DriverError::Setup(io::Error::other(e)))?;
        let memory = Arc::new(memory);
        Self::in_memory(
            memory,
            GuestAddress(0),
            size,
            slots,
            data_bytes,
            data_offset,
        )
    }

    /// The bytes of guest memory a driver of [`with_data_offset`](Self::with_data_offset)'s
    /// geometry lays its rings and slots out in (what [`in_memory`](Self::in_memory) needs).
    pub fn memory_bytes(
        size: u16,
        slots: u16,
        data_bytes: u32,
        data_offset: u32,
    ) -> Result<u64, DriverError> {
        if !size.is_power_of_two()
            || !(4..=32768).contains(&size)
            || slots == 0
            || u32::from(slots) * 3 > u32::from(size)
        {
            return Err(DriverError::BadSize { size, slots });
        }
        let (_, _, _, data, stride) = layout(0, size, slots, data_bytes, data_offset);
        Ok(data + stride * u64::from(slots))
    }

    /// As [`with_data_offset`](Self::with_data_offset), in the caller's `memory` (one shared
    /// with a vhost-user backend, say) from guest address `base`, aligned to 4 KiB:
    /// [`memory_bytes`](Self::memory_bytes) bytes from there hold the rings and the slots.
    pub fn in_memory(
        memory: GuestMemory,
        base: GuestAddress,
        size: u16,
        slots: u16,
        data_bytes: u32,
        data_offset: u32,
    ) -> Result<(Self, DeviceSide), DriverError> {
        let total = Self::memory_bytes(size, slots, data_bytes, data_offset)?;
        if base.0 % PAGE != 0 || !memory.check_range(base, total as usize) {
            return Err(DriverError::Setup(io::Error::other(
                "the rings and slots do not fit in the memory given",
            )));
        }
        let data_offset = data_offset % PAGE as u32;
        let desc = base.0;
        let (avail, used, meta, data, stride) = layout(desc, size, slots, data_bytes, data_offset);
        // Both rings start empty (`flags` and `idx` 0), whatever the memory held.
        memory.write_obj(0u32, GuestAddress(avail))?;
        memory.write_obj(0u32, GuestAddress(used))?;
        let (kick, call) = (
            eventfd().map_err(DriverError::Setup)?,
            eventfd().map_err(DriverError::Setup)?,
        );
        let mut queue = Queue::new(size).map_err(|e| DriverError::Setup(io::Error::other(e)))?;
        queue.set_size(size);
        let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
        let (lo, hi) = split(desc);
        queue.set_desc_table_address(lo, hi);
        let (lo, hi) = split(avail);
        queue.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(used);
        queue.set_used_ring_address(lo, hi);
        queue.set_ready(true);
        let device = DeviceSide {
            queue,
            memory: memory.clone(),
            kick: kick.try_clone().map_err(DriverError::Setup)?,
            call: call.try_clone().map_err(DriverError::Setup)?,
        };
        let driver = SplitRingDriver {
            memory,
            size,
            slots,
            data_bytes,
            stride,
            data_offset,
            desc: GuestAddress(desc),
            avail: GuestAddress(avail),
            used: GuestAddress(used),
            meta: GuestAddress(meta),
            data: GuestAddress(data),
            next_avail: 0,
            next_used: 0,
            kick,
            call,
        };
        Ok((driver, device))
    }

    /// The request slots.
    pub fn slots(&self) -> u16 {
        self.slots
    }

    /// The bytes each slot's data buffer holds.
    pub fn data_bytes(&self) -> u32 {
        self.data_bytes
    }

    /// The guest memory.
    pub fn memory(&self) -> &GuestMemory {
        &self.memory
    }

    /// Where slot `slot`'s data buffer starts in guest memory.
    pub fn data_addr(&self, slot: u16) -> GuestAddress {
        GuestAddress(self.data.0 + u64::from(slot) * self.stride + u64::from(self.data_offset))
    }

    /// Where the descriptor table, the avail ring and the used ring are in guest memory.
    pub fn ring_addrs(&self) -> (GuestAddress, GuestAddress, GuestAddress) {
        (self.desc, self.avail, self.used)
    }

    /// Where slot `slot`'s status byte is in guest memory.
    pub fn status_addr(&self, slot: u16) -> GuestAddress {
        GuestAddress(self.meta.0 + SLOT_META_BYTES * u64::from(slot) + 16)
    }

    /// Copies `bytes` into slot `slot`'s data buffer (a write's data).
    pub fn write_data(&self, slot: u16, bytes: &[u8]) -> Result<(), DriverError> {
        self.check(slot, bytes.len())?;
        Ok(self.memory.write_slice(bytes, self.data_addr(slot))?)
    }

    /// Copies slot `slot`'s data buffer into `bytes` (a read's data).
    pub fn read_data(&self, slot: u16, bytes: &mut [u8]) -> Result<(), DriverError> {
        self.check(slot, bytes.len())?;
        Ok(self.memory.read_slice(bytes, self.data_addr(slot))?)
    }

    /// Slot `slot`'s data buffer as bytes, to fill a write's data or check a read's in place.
    ///
    /// # Safety
    ///
    /// The slot has no request in flight (its last one was taken from the used ring, its
    /// next is not posted): the device does not touch the buffer while the slice lives.
    pub unsafe fn data_mut(&mut self, slot: u16) -> Result<&mut [u8], DriverError> {
        self.check(slot, 0)?;
        let len = self.data_bytes as usize;
        let volatile = self.memory.get_slice(self.data_addr(slot), len)?;
        let ptr = volatile.ptr_guard_mut().as_ptr();
        // SAFETY: `ptr` is `len` bytes of this driver's own mapping (one region, so one
        // slice), which lives as long as `self.memory` and so as long as `&mut self`; no
        // other slot's buffer overlaps it, and the caller promises the device is not using
        // it; `&mut self` keeps this driver from handing out a second slice meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    fn check(&self, slot: u16, len: usize) -> Result<(), DriverError> {
        let bad = |reason| Err(DriverError::BadRequest { slot, reason });
        if slot >= self.slots {
            return bad("out of range");
        }
        if len > self.data_bytes as usize {
            return bad("longer than the slot's buffer");
        }
        Ok(())
    }

    fn write_desc(
        &self,
        index: u16,
        addr: u64,
        len: u32,
        flags: u32,
        next: u16,
    ) -> Result<(), DriverError> {
        let at = self.desc.0 + DESC_BYTES * u64::from(index);
        self.memory.write_obj(addr.to_le(), GuestAddress(at))?;
        self.memory.write_obj(len.to_le(), GuestAddress(at + 8))?;
        self.memory
            .write_obj((flags as u16).to_le(), GuestAddress(at + 12))?;
        self.memory.write_obj(next.to_le(), GuestAddress(at + 14))?;
        Ok(())
    }

    /// Posts `request` in slot `slot` (free: its previous request finished): the header, the
    /// data buffer (written by the device for `IN` and `GET_ID`, read for `OUT`, `DISCARD` and
    /// `WRITE_ZEROES`, whose segment the caller wrote into it) and the
    /// status byte, then the head in the avail ring. The device sees it once the avail index
    /// is published, which this does at once; call [`notify`](Self::notify) after a batch.
    pub fn post(&mut self, slot: u16, request: DriverRequest) -> Result<(), DriverError> {
        self.check(slot, request.len as usize)?;
        let meta = self.meta.0 + SLOT_META_BYTES * u64::from(slot);
        self.memory
            .write_obj(request.kind.to_le(), GuestAddress(meta))?;
        self.memory.write_obj(0u32, GuestAddress(meta + 4))?;
        self.memory
            .write_obj(request.sector.to_le(), GuestAddress(meta + 8))?;
        // A status the device must overwrite.
        self.memory.write_obj(0xffu8, GuestAddress(meta + 16))?;
        let head = slot * 3;
        let next = VRING_DESC_F_NEXT;
        if request.len > 0 {
            self.write_desc(head, meta, spec::HEADER_BYTES, next, head + 1)?;
            let device_writes = matches!(request.kind, spec::T_IN | spec::T_GET_ID);
            let flags = next | if device_writes { VRING_DESC_F_WRITE } else { 0 };
            self.write_desc(
                head + 1,
                self.data_addr(slot).0,
                request.len,
                flags,
                head + 2,
            )?;
        } else {
            self.write_desc(head, meta, spec::HEADER_BYTES, next, head + 2)?;
        }
        self.write_desc(head + 2, meta + 16, 1, VRING_DESC_F_WRITE, 0)?;
        let ring_at = self.avail.0 + 4 + 2 * u64::from(self.next_avail % self.size);
        self.memory.write_obj(head.to_le(), GuestAddress(ring_at))?;
        self.next_avail = self.next_avail.wrapping_add(1);
        // The descriptors and the ring entry before the index (the device loads it Acquire).
        self.memory.store(
            self.next_avail.to_le(),
            GuestAddress(self.avail.0 + 2),
            Ordering::Release,
        )?;
        Ok(())
    }

    /// Rings the kick eventfd unless the device said it needs no kick (it is polling the
    /// ring); returns whether it rang.
    pub fn notify(&self) -> io::Result<bool> {
        // The avail index published before the device's flag is read (the device sets the
        // flag, then reads the index once more).
        fence(Ordering::SeqCst);
        let flags: u16 = self
            .memory
            .load(self.used, Ordering::Acquire)
            .map_err(io::Error::other)?;
        if u32::from(u16::from_le(flags)) & VRING_USED_F_NO_NOTIFY != 0 {
            return Ok(false);
        }
        (&self.kick).write_all(&1u64.to_ne_bytes())?;
        Ok(true)
    }

    /// Moves the finished requests of the used ring into `out`; returns how many.
    pub fn take_used(&mut self, out: &mut Vec<Finished>) -> Result<usize, DriverError> {
        let used_idx: u16 = self
            .memory
            .load(GuestAddress(self.used.0 + 2), Ordering::Acquire)?;
        let used_idx = u16::from_le(used_idx);
        let mut n = 0;
        while self.next_used != used_idx {
            let at = self.used.0 + 4 + 8 * u64::from(self.next_used % self.size);
            let id = u32::from_le(self.memory.read_obj(GuestAddress(at))?);
            let written = u32::from_le(self.memory.read_obj(GuestAddress(at + 4))?);
            let slot = (id / 3) as u16;
            let meta = self.meta.0 + SLOT_META_BYTES * u64::from(slot);
            let status = self.memory.read_obj(GuestAddress(meta + 16))?;
            out.push(Finished {
                slot,
                status,
                written,
            });
            self.next_used = self.next_used.wrapping_add(1);
            n += 1;
        }
        Ok(n)
    }

    /// The call eventfd (the interrupt), for a caller that waits on several queues at once
    /// (`poll(2)` for `POLLIN`, then [`clear_interrupt`](Self::clear_interrupt)).
    pub fn interrupt_fd(&self) -> BorrowedFd<'_> {
        self.call.as_fd()
    }

    /// Clears a raised interrupt; returns whether it was raised.
    pub fn clear_interrupt(&self) -> io::Result<bool> {
        let mut counter = [0u8; 8];
        match (&self.call).read(&mut counter) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until the device raises the interrupt or `timeout` passes (`None`: forever);
    /// returns whether it was raised (and clears it).
    pub fn wait_interrupt(&self, timeout: Option<Duration>) -> io::Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let ms = timeout.map_or(PollTimeout::NONE, |t| {
            PollTimeout::try_from(t.as_millis().min(i32::MAX as u128) as i32)
                .unwrap_or(PollTimeout::MAX)
        });
        let mut fds = [PollFd::new(self.call.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.clear_interrupt()
    }
}
