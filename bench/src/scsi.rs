//! The scsi-disk model of seed 003, in process: disks on one iothread, a guest driving them.
//!
//! This module owns the model and one cell's run:
//!
//! * a **disk** is a backing image (an O_DIRECT file), a request queue (the virtqueue's available
//!   ring), a doorbell [`Notifier`] registered in the iothread's context with `io_read` and
//!   `io_poll` handlers (the ioeventfd), and a completion path back to the guest (the used ring
//!   and an interrupt notifier);
//! * the **guest** is one load-generator thread per active disk, keeping `iodepth` requests in
//!   flight, as fio does in the guest;
//! * the **iothread** is the calling thread: one [`AioContext`] over the chosen monitor, every
//!   disk's doorbell registered (idle disks too: that is what seed 003 measures), requests
//!   pushed into the chosen engine, completions pushed back to the guest.
//!
//! It never touches a backend's internals: only the `EventLoop` and `IoEngine` traits.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aio_core::engine::{AlignedBuf, AttachedEngine, IoEngine, Request};
use aio_core::{AioContext, EventLoop, FdHandler, LoopCounters, Notifier, PollParams};
use hdrhistogram::Histogram;

use crate::image::DiskImage;
use crate::job::{latency_histogram, thread_cpu_seconds, Pattern, Rng};

/// One guest request in a virtqueue.
#[derive(Debug, Clone, Copy)]
struct GuestRequest {
    slot: u32,
    offset: u64,
    write: bool,
}

/// A virtqueue: the available ring and doorbell (guest -> iothread), the used ring and
/// interrupt (iothread -> guest).
struct Virtqueue {
    avail: Mutex<VecDeque<GuestRequest>>,
    avail_len: AtomicUsize,
    doorbell: Notifier,
    used: Mutex<Vec<(u32, i64)>>,
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
    /// The I/O pattern (`RandRead` and `RandWrite` mixed 50/50 when `mixed` is set).
    pub pattern: Pattern,
    /// 50/50 random reads and writes (fio `randrw`).
    pub mixed: bool,
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
}

struct GuestStats {
    ios: u64,
    bytes: u64,
    errors: u64,
    hist: Histogram<u64>,
}

fn guest(
    vq: Arc<Virtqueue>,
    spec: CellSpec,
    blocks: u64,
    seed: u64,
    finished: Arc<AtomicUsize>,
    wake_iothread: aio_core::NotifyHandle,
) -> GuestStats {
    let mut stats = GuestStats {
        ios: 0,
        bytes: 0,
        errors: 0,
        hist: latency_histogram(),
    };
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let measure_from = start + spec.ramp;
    let deadline = measure_from + spec.runtime;
    let mut seq = 0u64;
    let mut issued_at = vec![start; spec.iodepth];
    let mut outstanding = 0usize;
    let mut free: Vec<u32> = (0..spec.iodepth as u32).collect();
    loop {
        let now = Instant::now();
        if now < deadline && !free.is_empty() {
            let mut queue = vq.avail.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(slot) = free.pop() {
                let block = if matches!(spec.pattern, Pattern::Read | Pattern::Write) && !spec.mixed
                {
                    seq += 1;
                    (seq - 1) % blocks
                } else {
                    rng.next() % blocks
                };
                let write = if spec.mixed {
                    rng.next() & 1 == 0
                } else {
                    matches!(spec.pattern, Pattern::Write | Pattern::RandWrite)
                };
                issued_at[slot as usize] = now;
                queue.push_back(GuestRequest {
                    slot,
                    offset: block * spec.bs as u64,
                    write,
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
        let mut pfd = libc::pollfd {
            fd: vq.interrupt.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        vq.interrupt.test_and_clear();
        let done: Vec<(u32, i64)> =
            std::mem::take(&mut *vq.used.lock().unwrap_or_else(PoisonError::into_inner));
        let now = Instant::now();
        for (slot, res) in done {
            outstanding -= 1;
            free.push(slot);
            if now >= measure_from && now < deadline {
                if res < 0 {
                    stats.errors += 1;
                } else {
                    stats.ios += 1;
                    stats.bytes += res as u64;
                    let ns = now.duration_since(issued_at[slot as usize]).as_nanos() as u64;
                    let _ = stats.hist.record(ns.max(1));
                }
            }
        }
        if now >= deadline + Duration::from_secs(30) {
            // The iothread stopped answering: give up rather than hang the bench.
            stats.errors += outstanding as u64;
            break;
        }
    }
    finished.fetch_add(1, Ordering::AcqRel);
    wake_iothread.notify();
    stats
}

type Buffers = Rc<RefCell<Vec<Vec<Option<AlignedBuf>>>>>;

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
    let ctx = AioContext::new(monitor)?;
    ctx.set_poll_params(PollParams {
        max_ns: spec.poll_max_ns,
        ..PollParams::iothread()
    });
    ctx.set_poll_idle_interval(spec.poll_idle);
    let queues: Vec<Arc<Virtqueue>> = (0..spec.disks)
        .map(|_| Virtqueue::new().map(Arc::new))
        .collect::<io::Result<_>>()?;
    let buffers: Buffers = Rc::new(RefCell::new(
        (0..spec.active)
            .map(|_| {
                (0..spec.iodepth)
                    .map(|_| {
                        let mut b = AlignedBuf::new(spec.bs);
                        b.fill(0x5a);
                        Some(b)
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
        let res = match &c.result {
            Ok(n) => *n as i64,
            Err(e) => -(e.raw_os_error().unwrap_or(libc::EIO) as i64),
        };
        bufs.borrow_mut()[disk][slot as usize] = c.buf.into_one();
        q[disk]
            .used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((slot, res));
        let _ = q[disk].interrupt.notify();
    })?;
    let attached: Rc<AttachedEngine<L, E>> = Rc::new(attached);
    // The ioeventfd handlers: every disk, active or idle.
    for (disk, vq) in queues.iter().enumerate() {
        let process = {
            let (vq, engine, bufs, file) = (
                vq.clone(),
                attached.clone(),
                buffers.clone(),
                images[disk].file().clone(),
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
                    let buf = bufs.borrow_mut()[disk][r.slot as usize]
                        .take()
                        .expect("a slot's buffer is home while the guest may reuse it");
                    let req = if r.write {
                        Request::write(&file, r.offset, buf, token)
                    } else {
                        Request::read(&file, r.offset, buf, token)
                    };
                    if let Err(e) = engine.submit(req) {
                        bufs.borrow_mut()[disk][r.slot as usize] =
                            e.request.op.into_buffers().into_one();
                        vq.used
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((r.slot, -(libc::EINVAL as i64)));
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
            std::thread::Builder::new()
                .name(format!("guest-{disk}"))
                .spawn(move || guest(vq, spec, blocks.max(1), 0x9e37 + disk as u64, fin, wake))
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
    };
    for g in guests {
        let s = g
            .join()
            .map_err(|_| io::Error::other("a guest thread panicked"))?;
        result.ios += s.ios;
        result.bytes += s.bytes;
        result.errors += s.errors;
        let _ = result.latency_ns.add(&s.hist);
    }
    for vq in &queues {
        let _ = ctx.remove_fd_handler(vq.doorbell.as_raw_fd());
    }
    drop(ctx);
    Ok(result)
}
