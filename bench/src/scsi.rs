//! The scsi-disk model of the scaling test from the QEMU epoll discussion (1..256 disks on one
//! IOThread), in process: disks on one iothread, a guest driving them.
//!
//! This module owns the model and one cell's run:
//!
//! * a **disk** is a backing image (an O_DIRECT file, or a region of a block device), a request
//!   queue (the virtqueue's available ring), a doorbell [`Notifier`] registered in the
//!   iothread's context with `io_read` and `io_poll` handlers (the ioeventfd), and a completion
//!   path back to the guest (the used ring and an interrupt notifier);
//! * the **guest** is one load-generator thread per active disk, keeping `iodepth` requests in
//!   flight, as fio does in the guest;
//! * the **iothread** is the calling thread: one [`AioContext`] over the chosen monitor, every
//!   disk's doorbell registered (idle disks too: that is what the QEMU test measures),
//!   requests pushed into the chosen engine, completions pushed back to the guest.
//!
//! It never touches a backend's internals: only the `EventLoop` and `IoEngine` traits.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aio_core::engine::{AlignedBuf, AttachedEngine, IoEngine, Request};
use aio_core::{AioContext, EventLoop, FdHandler, LoopCounters, Notifier, PollParams};
use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags};

use crate::image::DiskImage;
use crate::job::{latency_histogram, thread_cpu_seconds, OffsetStream, Pattern};
use crate::verify::{self, Ledger, VerifyError};

/// One guest request in a virtqueue.
#[derive(Debug, Clone, Copy)]
struct GuestRequest {
    slot: u32,
    offset: u64,
    write: bool,
    /// With verify: the generation a write stamps.
    generation: u64,
}

/// One entry of the used ring: a finished request.
#[derive(Debug, Clone)]
struct UsedEntry {
    slot: u32,
    /// Bytes, or a negative errno.
    result: i64,
    /// With verify, for a read that succeeded: the stamp's generation, or what is wrong.
    stamp: Option<Result<u64, VerifyError>>,
}

/// A virtqueue: the available ring and doorbell (guest -> iothread), the used ring and
/// interrupt (iothread -> guest).
struct Virtqueue {
    avail: Mutex<VecDeque<GuestRequest>>,
    avail_len: AtomicUsize,
    doorbell: Notifier,
    used: Mutex<Vec<UsedEntry>>,
    interrupt: Notifier,
}

impl Virtqueue {
    fn new() -> io::Result<Self> {
        Ok(Virtqueue {
            avail: Mutex::new(VecDeque::new()),
            avail_len: AtomicUsize::new(0),
            doorbell: Notifier::new()?,
            used: Mutex::new(Vec::new()),
            interrupt: Notifier::new()?,
        })
    }
}

/// What one cell runs.
#[derive(Debug, Clone, Copy)]
pub struct CellSpec {
    /// Disks attached to the iothread.
    pub disks: usize,
    /// Disks the guest drives (the first `active` ones).
    pub active: usize,
    /// The I/O pattern (mixed patterns are 50/50 reads and writes).
    pub pattern: Pattern,
    /// Block size.
    pub bs: usize,
    /// Requests in flight per active disk.
    pub iodepth: usize,
    /// Measured time.
    pub runtime: Duration,
    /// Warm-up.
    pub ramp: Duration,
    /// The iothread's adaptive polling limit.
    pub poll_max_ns: u64,
    /// How long a disk may stay idle before its doorbell leaves the poll set (QEMU: 7 s).
    pub poll_idle: Duration,
    /// Stamp every block written and check every block read ([`crate::verify`]); the images
    /// must have been created with [`DiskImage::create_stamped`]. One request per block at a
    /// time, so that each read has exactly one right answer.
    pub verify: bool,
}

/// What one cell measured.
#[derive(Debug, Clone)]
pub struct CellResult {
    /// Requests completed in the measured window (all active disks).
    pub ios: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// The measured window.
    pub elapsed: Duration,
    /// Guest-side latency (doorbell to interrupt), ns.
    pub latency_ns: Histogram<u64>,
    /// The iothread's loop counters.
    pub counters: LoopCounters,
    /// The iothread's CPU time, s.
    pub iothread_cpu_s: f64,
    /// Requests that failed.
    pub errors: u64,
    /// With verify: reads checked.
    pub verified_reads: u64,
    /// With verify: reads that did not hold what was last written there.
    pub verify_errors: u64,
    /// With verify: the first mismatches (up to 10), each naming its disk and offset.
    pub verify_reports: Vec<String>,
}

struct GuestStats {
    ios: u64,
    bytes: u64,
    errors: u64,
    hist: Histogram<u64>,
    verified_reads: u64,
    verify_errors: u64,
    verify_reports: Vec<String>,
}

/// Where each slot's request went, for the guest's bookkeeping.
#[derive(Debug, Clone, Copy)]
struct SlotInfo {
    issued_at: Instant,
    block: u64,
    write: bool,
    generation: u64,
}

fn guest(
    vq: Arc<Virtqueue>,
    spec: CellSpec,
    disk: usize,
    blocks: u64,
    ledger: Option<Arc<Mutex<Ledger>>>,
    finished: Arc<AtomicUsize>,
    wake_iothread: aio_core::NotifyHandle,
) -> GuestStats {
    let done = GuestDone {
        finished,
        wake_iothread,
    };
    let mut stats = GuestStats {
        ios: 0,
        bytes: 0,
        errors: 0,
        hist: latency_histogram(),
        verified_reads: 0,
        verify_errors: 0,
        verify_reports: Vec::new(),
    };
    let mut offsets = OffsetStream::new(
        spec.pattern,
        50,
        blocks,
        spec.bs as u64,
        0x9e37 + disk as u64,
    );
    // This guest is the disk's only writer while the cell runs.
    let mut ledger_guard = ledger
        .as_ref()
        .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner));
    let mut ledger = ledger_guard.as_deref_mut();
    let start = Instant::now();
    let measure_from = start + spec.ramp;
    let deadline = measure_from + spec.runtime;
    let mut slots = vec![
        SlotInfo {
            issued_at: start,
            block: 0,
            write: false,
            generation: 0,
        };
        spec.iodepth
    ];
    let mut outstanding = 0usize;
    let mut free: Vec<u32> = (0..spec.iodepth as u32).collect();
    loop {
        let now = Instant::now();
        if now < deadline && !free.is_empty() {
            let mut queue = vq.avail.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(&slot) = free.last() {
                let mut block = offsets.next_block();
                if let Some(l) = &ledger {
                    // One request per block at a time; give up for now if all tried are busy.
                    let mut tries = 0;
                    while l.busy[block as usize] && tries < 64 {
                        block = offsets.next_block();
                        tries += 1;
                    }
                    if l.busy[block as usize] {
                        break;
                    }
                }
                free.pop();
                let write = offsets.next_is_write();
                let mut generation = 0;
                if let Some(l) = &mut ledger {
                    l.busy[block as usize] = true;
                    if write {
                        generation = l.next_generation;
                        l.next_generation += 1;
                    }
                }
                slots[slot as usize] = SlotInfo {
                    issued_at: now,
                    block,
                    write,
                    generation,
                };
                queue.push_back(GuestRequest {
                    slot,
                    offset: offsets.offset(block),
                    write,
                    generation,
                });
                outstanding += 1;
            }
            vq.avail_len.store(queue.len(), Ordering::Release);
            drop(queue);
            // The guest kicks the ioeventfd.
            let _ = vq.doorbell.notify();
        }
        if outstanding == 0 {
            break;
        }
        // Wait for the interrupt.
        let mut pfd = [PollFd::new(vq.interrupt.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut pfd, 100u16);
        vq.interrupt.test_and_clear();
        let done: Vec<UsedEntry> =
            std::mem::take(&mut *vq.used.lock().unwrap_or_else(PoisonError::into_inner));
        let now = Instant::now();
        for entry in done {
            outstanding -= 1;
            free.push(entry.slot);
            let info = slots[entry.slot as usize];
            if let Some(l) = &mut ledger {
                let b = info.block as usize;
                l.busy[b] = false;
                if info.write {
                    l.acked[b] = (entry.result >= 0).then_some(info.generation);
                } else if entry.result >= 0 {
                    stats.verified_reads += 1;
                    let offset = offsets.offset(info.block);
                    let stamp = entry
                        .stamp
                        .unwrap_or(Err(VerifyError::NotStamped { offset }));
                    if let Err(e) = l.judge(info.block, offset, stamp) {
                        stats.verify_errors += 1;
                        if stats.verify_reports.len() < 10 {
                            stats.verify_reports.push(format!("disk {disk}: {e}"));
                        }
                    }
                }
            }
            if now >= measure_from && now < deadline {
                if entry.result < 0 {
                    stats.errors += 1;
                } else {
                    stats.ios += 1;
                    stats.bytes += entry.result as u64;
                    let ns = now.duration_since(info.issued_at).as_nanos() as u64;
                    let _ = stats.hist.record(ns.max(1));
                }
            }
        }
        if now >= deadline + Duration::from_secs(30) {
            // The iothread stopped answering: give up rather than hang the bench. The blocks
            // of the abandoned requests are free again but their contents unknown.
            stats.errors += outstanding as u64;
            if let Some(l) = &mut ledger {
                for (slot, info) in slots.iter().enumerate() {
                    if !free.contains(&(slot as u32)) {
                        l.busy[info.block as usize] = false;
                        l.acked[info.block as usize] = None;
                    }
                }
            }
            break;
        }
    }
    drop(done);
    stats
}

/// Counts a guest as finished and wakes the iothread when dropped: also when the guest
/// panics, so the iothread never waits for a guest that is gone.
struct GuestDone {
    finished: Arc<AtomicUsize>,
    wake_iothread: aio_core::NotifyHandle,
}

impl Drop for GuestDone {
    fn drop(&mut self) {
        self.finished.fetch_add(1, Ordering::AcqRel);
        self.wake_iothread.notify();
    }
}

/// The iothread's side of a guest slot: its buffer while it is home, and what the request in
/// flight does (for verify at completion).
struct HostSlot {
    buf: Option<AlignedBuf>,
    offset: u64,
    write: bool,
}

/// Every active disk's slots.
type HostSlots = Rc<RefCell<Vec<Vec<HostSlot>>>>;

/// Runs one cell on `images` (at least `spec.disks`; the first `spec.active` are driven).
pub fn run_cell<L, E>(
    monitor: L,
    engine: E,
    images: &[DiskImage],
    spec: CellSpec,
) -> io::Result<CellResult>
where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    assert!(images.len() >= spec.disks && spec.active <= spec.disks);
    if spec.verify {
        if let Some(i) = images[..spec.active].iter().position(|im| {
            im.ledger()
                .is_none_or(|l| l.lock().unwrap_or_else(PoisonError::into_inner).bs != spec.bs)
        }) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "verify: disk {i} ({}) was not stamped with bs {} (DiskImage::create_stamped)",
                    images[i].path().display(),
                    spec.bs
                ),
            ));
        }
    }
    let ctx = AioContext::new(monitor)?;
    ctx.set_poll_params(PollParams {
        max_ns: spec.poll_max_ns,
        ..PollParams::iothread()
    });
    ctx.set_poll_idle_interval(spec.poll_idle);
    let queues: Vec<Arc<Virtqueue>> = (0..spec.disks)
        .map(|_| Virtqueue::new().map(Arc::new))
        .collect::<io::Result<_>>()?;
    let buffers: HostSlots = Rc::new(RefCell::new(
        (0..spec.active)
            .map(|_| {
                (0..spec.iodepth)
                    .map(|_| {
                        let mut b = AlignedBuf::new(spec.bs);
                        b.fill(0x5a);
                        HostSlot {
                            buf: Some(b),
                            offset: 0,
                            write: false,
                        }
                    })
                    .collect()
            })
            .collect(),
    ));
    // Completions go back to the guest: used ring + interrupt.
    let (q, bufs) = (queues.clone(), buffers.clone());
    let attached = ctx.attach_engine(engine, move |_, c| {
        let disk = (c.token >> 32) as usize;
        let slot = c.token as u32;
        let result = match &c.result {
            Ok(n) => *n as i64,
            Err(e) => -(e.raw_os_error().unwrap_or(libc::EIO) as i64),
        };
        let mut bufs = bufs.borrow_mut();
        let host = &mut bufs[disk][slot as usize];
        host.buf = c.buf.into_one();
        let stamp = match (&host.buf, spec.verify && !host.write && result >= 0) {
            (Some(b), true) => Some(verify::check(b, host.offset)),
            _ => None,
        };
        q[disk]
            .used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(UsedEntry {
                slot,
                result,
                stamp,
            });
        let _ = q[disk].interrupt.notify();
    })?;
    let attached: Rc<AttachedEngine<L, E>> = Rc::new(attached);
    // The ioeventfd handlers: every disk, active or idle.
    for (disk, vq) in queues.iter().enumerate() {
        let process = {
            let (vq, engine, bufs, file, base) = (
                vq.clone(),
                attached.clone(),
                buffers.clone(),
                images[disk].file().clone(),
                images[disk].base(),
            );
            Rc::new(move || {
                let taken: Vec<GuestRequest> = {
                    let mut q = vq.avail.lock().unwrap_or_else(PoisonError::into_inner);
                    vq.avail_len.store(0, Ordering::Release);
                    q.drain(..).collect()
                };
                if taken.is_empty() {
                    return;
                }
                engine.plug();
                for r in taken {
                    let token = ((disk as u64) << 32) | r.slot as u64;
                    let mut buf = {
                        let mut slots = bufs.borrow_mut();
                        let host = &mut slots[disk][r.slot as usize];
                        host.offset = r.offset;
                        host.write = r.write;
                        host.buf
                            .take()
                            .expect("a slot's buffer is home while the guest may reuse it")
                    };
                    if spec.verify && r.write {
                        verify::stamp(&mut buf, r.offset, r.generation);
                    }
                    // The guest's offsets are the disk's; its image may be a device region.
                    let req = if r.write {
                        Request::write(&file, base + r.offset, buf, token)
                    } else {
                        Request::read(&file, base + r.offset, buf, token)
                    };
                    if let Err(e) = engine.submit(req) {
                        bufs.borrow_mut()[disk][r.slot as usize].buf =
                            e.request.op.into_buffers().into_one();
                        vq.used
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(UsedEntry {
                                slot: r.slot,
                                result: -(libc::EINVAL as i64),
                                stamp: None,
                            });
                        let _ = vq.interrupt.notify();
                    }
                }
                engine.unplug();
            })
        };
        let (p1, p2, vq2, vq3) = (process.clone(), process, vq.clone(), vq.clone());
        ctx.set_fd_handler(
            vq.doorbell.as_raw_fd(),
            FdHandler::new()
                .on_read(move |_| {
                    vq2.doorbell.test_and_clear();
                    p1();
                })
                .on_poll(move || vq3.avail_len.load(Ordering::Acquire) > 0)
                .on_poll_ready(move |_| p2()),
        )
        .map_err(io::Error::from)?;
    }
    let finished = Arc::new(AtomicUsize::new(0));
    let guests: Vec<_> = (0..spec.active)
        .map(|disk| {
            let (vq, fin, wake) = (queues[disk].clone(), finished.clone(), ctx.notify_handle());
            let blocks = images[disk].size() / spec.bs as u64;
            let ledger = spec
                .verify
                .then(|| images[disk].ledger().cloned())
                .flatten();
            std::thread::Builder::new()
                .name(format!("guest-{disk}"))
                .spawn(move || guest(vq, spec, disk, blocks.max(1), ledger, fin, wake))
        })
        .collect::<io::Result<_>>()?;
    let cpu0 = thread_cpu_seconds();
    while finished.load(Ordering::Acquire) < spec.active {
        ctx.poll(true);
    }
    let iothread_cpu_s = thread_cpu_seconds() - cpu0;
    let mut result = CellResult {
        ios: 0,
        bytes: 0,
        elapsed: spec.runtime,
        latency_ns: latency_histogram(),
        counters: ctx.counters(),
        iothread_cpu_s,
        errors: 0,
        verified_reads: 0,
        verify_errors: 0,
        verify_reports: Vec::new(),
    };
    for g in guests {
        let s = g
            .join()
            .map_err(|_| io::Error::other("a guest thread panicked"))?;
        result.ios += s.ios;
        result.bytes += s.bytes;
        result.errors += s.errors;
        let _ = result.latency_ns.add(&s.hist);
        result.verified_reads += s.verified_reads;
        result.verify_errors += s.verify_errors;
        result.verify_reports.extend(s.verify_reports);
    }
    for vq in &queues {
        let _ = ctx.remove_fd_handler(vq.doorbell.as_raw_fd());
    }
    drop(ctx);
    Ok(result)
}
