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
//!   flight, as fio does in the guest (its own file, `scsi/guest.rs`). Its data lives in the
//!   cell's one **guest RAM** region (`scsi/memory.rs`), a `bs` slot per request: the guest
//!   prepares a write's data there and finds a read's data there;
//! * the **iothread** is the calling thread: one [`AioContext`] over the chosen monitor, every
//!   disk's doorbell registered (idle disks too: that is what the QEMU test measures),
//!   requests pushed into the chosen engine pointing into guest RAM (or, with
//!   [`MemoryPath::Bounce`], copied through its own buffers), each completion pushed back to
//!   the guest by the request's own callback.
//!
//! [`run_cell`] is three steps: set up (the iothread's context with the engine attached and
//! every doorbell registered, then the guests), drive (the loop until every guest is done) and
//! collect (the guests' figures and the loop's counters). It never touches a backend's
//! internals: only the `EventLoop` and `IoEngine` traits.

mod guest;
mod memory;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use aio_core::engine::{
    AlignedBuf, AttachedEngine, Completion, GuestIovecs, IoBuffers, IoEngine, IoFile, Request,
};
use aio_core::{AioContext, EventLoop, FdHandler, LoopCounters, Notifier, PollParams};
use hdrhistogram::Histogram;

use self::guest::{GuestDone, GuestStats};
use self::memory::GuestRam;
pub use self::memory::MemoryPath;
use crate::image::DiskImage;
use crate::job::{latency_histogram, thread_cpu_seconds, Pattern};

/// One guest request in a virtqueue.
#[derive(Debug, Clone, Copy)]
struct GuestRequest {
    slot: u32,
    offset: u64,
    write: bool,
}

/// One entry of the used ring: a finished request.
#[derive(Debug, Clone)]
struct UsedEntry {
    slot: u32,
    /// Bytes, or a negative errno.
    result: i64,
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

    /// The iothread takes every request of the available ring.
    fn take_avail(&self) -> Vec<GuestRequest> {
        let mut q = self.avail.lock().unwrap_or_else(PoisonError::into_inner);
        self.avail_len.store(0, Ordering::Release);
        q.drain(..).collect()
    }

    /// The iothread puts a finished request on the used ring and raises the interrupt.
    fn push_used(&self, entry: UsedEntry) {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
        let _ = self.interrupt.notify();
    }

    /// The guest takes every entry of the used ring.
    fn take_used(&self) -> Vec<UsedEntry> {
        std::mem::take(&mut *self.used.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What one cell runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// time, so that each read has exactly one right answer. The guests stamp and check
    /// their data in guest RAM, on either memory path.
    pub verify: bool,
    /// How the data travels between guest RAM and the engine: straight (the engine reads
    /// and writes guest RAM) or through the iothread's bounce buffers (`--bounce`).
    pub memory: MemoryPath,
}

impl CellSpec {
    /// The quick matrix's cell (`aio-bench matrix`'s defaults; the matrix sets disks, active
    /// and pattern per cell): one disk driven with sequential reads of 4 KiB blocks at iodepth
    /// 8, 200 ms ramp and 1 s measured, QEMU's IOThread polling limit (32768 ns), idle disks
    /// out of the poll set after 100 ms, no verify, requests straight into guest RAM.
    pub const fn quick() -> CellSpec {
        CellSpec {
            disks: 1,
            active: 1,
            pattern: Pattern::Read,
            bs: 4096,
            iodepth: 8,
            runtime: Duration::from_secs(1),
            ramp: Duration::from_millis(200),
            poll_max_ns: 32_768,
            poll_idle: Duration::from_millis(100),
            verify: false,
            memory: MemoryPath::Guest,
        }
    }
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

impl CellResult {
    /// The iothread's figures, before any guest's are added.
    fn new(elapsed: Duration, counters: LoopCounters, iothread_cpu_s: f64) -> CellResult {
        CellResult {
            ios: 0,
            bytes: 0,
            elapsed,
            latency_ns: latency_histogram(),
            counters,
            iothread_cpu_s,
            errors: 0,
            verified_reads: 0,
            verify_errors: 0,
            verify_reports: Vec::new(),
        }
    }

    /// Adds one guest's figures.
    fn add(&mut self, s: GuestStats) {
        self.ios += s.ios;
        self.bytes += s.bytes;
        self.errors += s.errors;
        let _ = self.latency_ns.add(&s.hist);
        self.verified_reads += s.verified_reads;
        self.verify_errors += s.verify_errors;
        self.verify_reports.extend(s.verify_reports);
    }
}

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
    // Set up: the iothread with every disk attached, then a guest per active disk.
    check_stamps(images, &spec)?;
    let iothread = Iothread::set_up(monitor, engine, images, spec)?;
    let guests = iothread.spawn_guests(images)?;
    // Drive: the iothread's loop, until every guest is done.
    let iothread_cpu_s = iothread.drive();
    // Collect: the guests' figures and the loop's counters.
    iothread.collect(guests, iothread_cpu_s)
}

/// With verify: refuses a driven disk not stamped with the cell's block size.
fn check_stamps(images: &[DiskImage], spec: &CellSpec) -> io::Result<()> {
    if !spec.verify {
        return Ok(());
    }
    let unstamped = images[..spec.active].iter().position(|im| {
        im.ledger()
            .is_none_or(|l| l.lock().unwrap_or_else(PoisonError::into_inner).bs != spec.bs)
    });
    match unstamped {
        None => Ok(()),
        Some(i) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "verify: disk {i} ({}) was not stamped with bs {} (DiskImage::create_stamped)",
                images[i].path().display(),
                spec.bs
            ),
        )),
    }
}

/// The iothread's view of one disk: its virtqueue, where its blocks are, and the memory its
/// requests use.
struct HostDisk {
    index: usize,
    vq: Arc<Virtqueue>,
    file: IoFile,
    /// The disk's first byte in `file` (its image may be a device region).
    base: u64,
    ram: Arc<GuestRam>,
    memory: MemoryPath,
    /// With `--bounce`, the driven disk's buffer per slot, home while its slot has no request
    /// in flight (empty on the guest-memory path and for idle disks).
    bounce: RefCell<Vec<Option<AlignedBuf>>>,
}

impl HostDisk {
    /// Takes the available ring's requests into the engine, one plugged batch.
    fn process<L: EventLoop + 'static, E: IoEngine + 'static>(
        self: &Rc<Self>,
        engine: &AttachedEngine<L, E>,
    ) {
        let taken = self.vq.take_avail();
        if taken.is_empty() {
            return;
        }
        engine.plug();
        for r in taken {
            self.submit(engine, r);
        }
        engine.unplug();
    }

    /// Submits one guest request, its completion going to [`HostDisk::complete`]; a request
    /// the engine refuses goes straight to the used ring as `EINVAL`.
    fn submit<L: EventLoop + 'static, E: IoEngine + 'static>(
        self: &Rc<Self>,
        engine: &AttachedEngine<L, E>,
        r: GuestRequest,
    ) {
        let disk = self.clone();
        let (slot, write) = (r.slot, r.write);
        let sent = engine.submit_with(self.request(r), move |_, _, c| {
            disk.complete(slot, write, c)
        });
        if let Err(e) = sent {
            self.take_back(slot, 0, e.request.op.into_buffers());
            self.vq.push_used(UsedEntry {
                slot,
                result: -(libc::EINVAL as i64),
            });
        }
    }

    /// The engine's request for `r`: pointing into the slot's guest RAM, or with `--bounce`
    /// on the slot's buffer (for a write, a copy of the slot's guest RAM).
    fn request(&self, r: GuestRequest) -> Request {
        let token = ((self.index as u64) << 32) | r.slot as u64;
        // The guest's offsets are the disk's; its image may be a device region.
        let offset = self.base + r.offset;
        if self.memory == MemoryPath::Guest {
            let mem = self.ram.slot_ptr(self.index, r.slot);
            // SAFETY: the slot is the iothread's from the available ring to the used ring
            // (`GuestRam`): the guest does not touch it until `complete` has put the entry on
            // the used ring, after the engine handed these iovecs back. The mapping is removed
            // only after the engine is dropped (`Iothread`'s field order).
            let mem = unsafe { GuestIovecs::from_raw_parts(mem, self.ram.bs()) };
            return if r.write {
                Request::write_guest(&self.file, offset, mem, token)
            } else {
                Request::read_guest(&self.file, offset, mem, token)
            };
        }
        let mut buf = self.bounce.borrow_mut()[r.slot as usize]
            .take()
            .expect("a slot's buffer is home while the guest may reuse it");
        if r.write {
            // SAFETY: the slot is the iothread's until its used entry (`GuestRam`).
            buf.copy_from_slice(unsafe { self.ram.slot(self.index, r.slot) });
            Request::write(&self.file, offset, buf, token)
        } else {
            Request::read(&self.file, offset, buf, token)
        }
    }

    /// A request's completion: the slot's memory back (with `--bounce`, a read's data copied
    /// into guest RAM), then the used ring and the interrupt.
    fn complete(&self, slot: u32, write: bool, c: Completion) {
        let result = match &c.result {
            Ok(n) => *n as i64,
            Err(e) => -(e.raw_os_error().unwrap_or(libc::EIO) as i64),
        };
        let copy_in = if write { 0 } else { result.max(0) as usize };
        self.take_back(slot, copy_in, c.buf);
        self.vq.push_used(UsedEntry { slot, result });
    }

    /// Takes a request's memory back: guest iovecs are dropped (the engine is done with the
    /// slot), a bounce buffer goes home after its first `copy_in` bytes are copied into the
    /// slot's guest RAM.
    fn take_back(&self, slot: u32, copy_in: usize, bufs: IoBuffers) {
        if let IoBuffers::One(buf) = bufs {
            if copy_in > 0 {
                // SAFETY: the slot is the iothread's until its used entry (`GuestRam`).
                let mem = unsafe { self.ram.slot_mut(self.index, slot) };
                let n = copy_in.min(buf.len());
                mem[..n].copy_from_slice(&buf[..n]);
            }
            self.bounce.borrow_mut()[slot as usize] = Some(buf);
        }
    }
}

/// One cell's iothread: its context, with the engine attached and every disk's doorbell
/// registered, and the guest RAM. Fields drop in order: the context (and its handlers), then
/// the engine (waiting for the kernel and the workers to finish with every request), and the
/// guest RAM last, so that the mapping outlives every request pointing into it.
struct Iothread<L: EventLoop + 'static, E: IoEngine + 'static> {
    ctx: AioContext<L>,
    engine: Rc<AttachedEngine<L, E>>,
    queues: Vec<Arc<Virtqueue>>,
    /// Guests that have finished (or panicked).
    finished: Arc<AtomicUsize>,
    spec: CellSpec,
    ram: Arc<GuestRam>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Iothread<L, E> {
    /// The guest RAM, the context over `monitor` with the cell's polling, `engine` attached,
    /// and a virtqueue per disk with its doorbell registered.
    fn set_up(monitor: L, engine: E, images: &[DiskImage], spec: CellSpec) -> io::Result<Self> {
        let ram = Arc::new(GuestRam::new(spec.active, spec.iodepth, spec.bs)?);
        let ctx = AioContext::new(monitor)?;
        ctx.set_poll_params(PollParams::iothread().with_max_ns(spec.poll_max_ns));
        ctx.set_poll_idle_interval(spec.poll_idle);
        let queues: Vec<Arc<Virtqueue>> = (0..spec.disks)
            .map(|_| Virtqueue::new().map(Arc::new))
            .collect::<io::Result<_>>()?;
        // Every request is submitted with its own completion (`HostDisk::complete`).
        let engine = Rc::new(ctx.attach_engine(engine, |_, _| {})?);
        let iothread = Iothread {
            ctx,
            engine,
            queues,
            finished: Arc::new(AtomicUsize::new(0)),
            spec,
            ram,
        };
        // The ioeventfd handlers: every disk, active or idle.
        for (disk, image) in images[..spec.disks].iter().enumerate() {
            iothread.register_doorbell(disk, image)?;
        }
        Ok(iothread)
    }

    /// Registers disk `disk`'s doorbell: `io_read` and `io_poll_ready` take its requests into
    /// the engine, `io_poll` looks at its available ring.
    fn register_doorbell(&self, disk: usize, image: &DiskImage) -> io::Result<()> {
        let vq = &self.queues[disk];
        let driven = disk < self.spec.active && self.spec.memory == MemoryPath::Bounce;
        let bounce = (0..self.spec.iodepth)
            .filter(|_| driven)
            .map(|_| Some(AlignedBuf::new(self.spec.bs)))
            .collect();
        let host = Rc::new(HostDisk {
            index: disk,
            vq: vq.clone(),
            file: image.file().clone(),
            base: image.base(),
            ram: self.ram.clone(),
            memory: self.spec.memory,
            bounce: RefCell::new(bounce),
        });
        let engine = self.engine.clone();
        let process = Rc::new(move || host.process(&engine));
        let (p1, p2, vq2, vq3) = (process.clone(), process, vq.clone(), vq.clone());
        self.ctx
            .set_fd_handler(
                &vq.doorbell,
                FdHandler::new()
                    .on_read(move |_| {
                        vq2.doorbell.test_and_clear();
                        p1();
                    })
                    .on_poll(move || vq3.avail_len.load(Ordering::Acquire) > 0)
                    .on_poll_ready(move |_| p2()),
            )
            .map_err(io::Error::from)
    }

    /// A guest thread per active disk.
    fn spawn_guests(&self, images: &[DiskImage]) -> io::Result<Vec<JoinHandle<GuestStats>>> {
        let spec = self.spec;
        (0..spec.active)
            .map(|disk| {
                let blocks = images[disk].size() / spec.bs as u64;
                let ledger = spec
                    .verify
                    .then(|| images[disk].ledger().cloned())
                    .flatten();
                let done = GuestDone::new(self.finished.clone(), self.ctx.notify_handle());
                let vq = self.queues[disk].clone();
                guest::spawn(
                    vq,
                    self.ram.clone(),
                    spec,
                    disk,
                    blocks.max(1),
                    ledger,
                    done,
                )
            })
            .collect()
    }

    /// Runs the loop until every guest has finished; the iothread's CPU time meanwhile, s.
    fn drive(&self) -> f64 {
        let cpu0 = thread_cpu_seconds();
        while self.finished.load(Ordering::Acquire) < self.spec.active {
            self.ctx.poll(true);
        }
        thread_cpu_seconds() - cpu0
    }

    /// The cell's result: the loop's counters and every guest's figures; the doorbells
    /// deregistered and the context dropped.
    fn collect(
        self,
        guests: Vec<JoinHandle<GuestStats>>,
        iothread_cpu_s: f64,
    ) -> io::Result<CellResult> {
        let mut result = CellResult::new(self.spec.runtime, self.ctx.counters(), iothread_cpu_s);
        for g in guests {
            let stats = g
                .join()
                .map_err(|_| io::Error::other("a guest thread panicked"))?;
            result.add(stats);
        }
        for vq in &self.queues {
            let _ = self.ctx.remove_fd_handler(&vq.doorbell);
        }
        Ok(result)
    }
}
