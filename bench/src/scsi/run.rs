//! One cell's run on the real device: set up, drive, collect; on the calling thread or on K
//! iothreads.
//!
//! This module owns which thread runs what: the cell's shared parts ([`Rig`]: a
//! [`BlockDevice`] per disk, the guest and device sides of every virtqueue, the guests), the
//! one-iothread run on the calling thread (the monitor and engine given), and the run on
//! `spec.iothreads` [`IoThread`]s, each pinned (with `cpus`) and building its monitor, engine
//! and [`DataPlane`] on itself. The requests are served by `aio-virtio-blk`'s queue, exactly
//! as the daemon serves a guest; this module never submits I/O (the device does) or
//! generates load (`scsi/guest.rs`).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use aio_core::{EventLoop, IoEngine};
use aio_loop::{AioContext, IoThread, NotifyHandle};
use aio_virtio_blk::dataplane::{DataPlane, QueueKey, QueueSetup};
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::driver::{DeviceSide, SplitRingDriver};

use super::guest::{self, GuestDone, GuestPlace, GuestStats};
use super::result::{CellResult, IothreadFigures};
use super::spec::{check, iothread_of, CellSpec, MemoryPath};
use crate::cpus::{process_cpu_seconds, thread_cpu_seconds};
use crate::targets::image::DiskImage;

/// The queues one iothread serves: each queue's key and device side.
type Places = Vec<(QueueKey, QueueSetup)>;

/// The device side of one queue, with its disk, until an iothread takes it.
type DeviceHalf = Option<(Arc<BlockDevice>, DeviceSide)>;

/// What an iothread keeps for the cell: its data plane and the keys of its queues.
struct Served<L: EventLoop + 'static, E: IoEngine + 'static> {
    plane: DataPlane<L, E>,
    keys: Vec<QueueKey>,
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> Served<L, E> {
    /// Sets `ctx` up for the cell (its polling), attaches `engine` and starts every queue of
    /// `places`.
    fn set_up(ctx: &AioContext<L>, engine: E, spec: &CellSpec, places: Places) -> io::Result<Self> {
        ctx.set_poll_params(spec.poll_max_ns.params());
        ctx.set_poll_idle_interval(spec.poll_idle);
        let plane = DataPlane::new(ctx, engine)?;
        let mut keys = Vec::with_capacity(places.len());
        for (key, setup) in places {
            plane.start(ctx, key, setup).map_err(io::Error::other)?;
            keys.push(key);
        }
        Ok(Served { plane, keys })
    }

    /// This iothread's figures since `cpu0`, and its queues stopped (the guests are done:
    /// every request taken has completed).
    fn collect(&self, ctx: &AioContext<L>, cpu0: f64) -> IothreadFigures {
        let stats: Vec<_> = (self.keys.iter())
            .filter_map(|&k| self.plane.stats(k))
            .collect();
        let figures = IothreadFigures {
            queues: self.keys.len(),
            cpu_s: thread_cpu_seconds() - cpu0,
            counters: ctx.counters(),
            interrupts: stats.iter().map(|s| s.interrupts).sum(),
            bounced: stats.iter().map(|s| s.bounced).sum(),
        };
        for &k in &self.keys {
            self.plane.stop(ctx, k);
        }
        figures
    }
}

/// A cell's shared parts: a device per disk and both sides of every virtqueue. The guest
/// side of a queue ([`SplitRingDriver`], its guest memory) goes to the disk's guest thread,
/// the device side to the iothread that serves it; each queue holds its guest memory (an
/// `Arc`) until it stops, so memory the kernel may still write is never unmapped early.
struct Rig<'a> {
    spec: CellSpec,
    images: &'a [DiskImage],
    /// `drivers[d][q]`: the guest side of queue `q` of disk `d`, until its guest takes it
    /// (an idle disk's stay here, with their eventfds, until the cell ends).
    drivers: Vec<Vec<Option<SplitRingDriver>>>,
    /// `sides[d][q]`: the device side, until its iothread takes it.
    sides: Vec<Vec<DeviceHalf>>,
    /// Guests that have finished (or panicked).
    finished: Arc<AtomicUsize>,
}

/// The ring size and slots of each queue of a disk driven at `iodepth` over `queues` queues:
/// slot `s` of the guest goes on queue `s % queues`, three descriptors per slot.
fn queue_layout(iodepth: usize, queues: usize) -> (u16, u16) {
    let slots = iodepth.div_ceil(queues).max(1);
    let size = (slots * 3).next_power_of_two().max(4);
    (size.min(32768) as u16, slots.min(10922) as u16)
}

impl<'a> Rig<'a> {
    /// Checks `spec` against `images`, opens a device on each image (its window of the file
    /// or block device) and makes both sides of every queue.
    fn new(images: &'a [DiskImage], spec: CellSpec) -> io::Result<Self> {
        check(images, &spec)?;
        let (size, slots) = queue_layout(spec.iodepth, spec.queues);
        // Guest buffers misaligned for O_DIRECT make the device copy through its bounce
        // buffers (`--bounce`).
        let data_offset = match spec.memory {
            MemoryPath::Guest => 0,
            MemoryPath::Bounce => 1,
        };
        let options = DiskOptions {
            queues: spec.queues as u16,
            ..DiskOptions::default()
        };
        let (mut drivers, mut sides) = (Vec::new(), Vec::new());
        for image in &images[..spec.disks] {
            let device = BlockDevice::window(
                image.file().clone(),
                image.base(),
                image.size(),
                options.clone(),
            )
            .map_err(io::Error::from)?;
            let device = Arc::new(device);
            let (mut d, mut s) = (Vec::new(), Vec::new());
            for _ in 0..spec.queues {
                let (driver, side) =
                    SplitRingDriver::with_data_offset(size, slots, spec.bs as u32, data_offset)
                        .map_err(io::Error::other)?;
                d.push(Some(driver));
                s.push(Some((device.clone(), side)));
            }
            drivers.push(d);
            sides.push(s);
        }
        Ok(Rig {
            spec,
            images,
            drivers,
            sides,
            finished: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The queues iothread `t` serves ([`iothread_of`]), idle disks' included.
    fn places(&mut self, t: usize) -> Places {
        let (k, per_disk) = (self.spec.iothreads, self.spec.queues);
        let mut places = Vec::new();
        for (disk, queues) in self.sides.iter_mut().enumerate() {
            for (q, side) in queues.iter_mut().enumerate() {
                if iothread_of(disk, q, per_disk, k) != t {
                    continue;
                }
                if let Some((device, side)) = side.take() {
                    let setup = QueueSetup::new(
                        device,
                        side.queue,
                        side.memory,
                        side.kick,
                        Some(side.call),
                    );
                    places.push(((disk as u32, q as u16), setup));
                }
            }
        }
        places
    }

    /// A guest thread per active disk, pinned to `cpus` (empty: not pinned); each wakes `wake`
    /// (if any) when it finishes.
    fn spawn_guests(
        &mut self,
        cpus: &[usize],
        wake: Option<NotifyHandle>,
    ) -> io::Result<Vec<JoinHandle<GuestStats>>> {
        let spec = self.spec;
        let mut guests = Vec::with_capacity(spec.active);
        for disk in 0..spec.active {
            let image = &self.images[disk];
            let blocks = image.size() / spec.bs as u64;
            let ledger = spec.verify.then(|| image.ledger().cloned()).flatten();
            let place = GuestPlace {
                cpus: cpus.to_vec(),
                done: GuestDone::new(self.finished.clone(), wake.clone()),
            };
            let drivers = self.drivers[disk].iter_mut().filter_map(Option::take);
            guests.push(guest::spawn(
                drivers.collect(),
                spec,
                disk,
                blocks.max(1),
                ledger,
                place,
            )?);
        }
        Ok(guests)
    }

    /// Every guest's figures.
    fn join(guests: Vec<JoinHandle<GuestStats>>) -> io::Result<Vec<GuestStats>> {
        guests
            .into_iter()
            .map(|g| {
                g.join()
                    .map_err(|_| io::Error::other("a guest thread panicked"))
            })
            .collect()
    }

    /// The cell's result from the iothreads' and the guests' figures.
    fn result(
        &self,
        per_iothread: Vec<IothreadFigures>,
        guests: Vec<GuestStats>,
        process_cpu_s: f64,
    ) -> CellResult {
        let mut result = CellResult::new(self.spec.runtime, per_iothread);
        result.process_cpu_s = process_cpu_s;
        for g in guests {
            result.add(g);
        }
        result
    }
}

/// Runs one cell on `images` (at least `spec.disks`; the first `spec.active` are driven) with
/// one iothread, the calling thread, over `monitor` with `engine` attached: both are used as
/// given, so they need not be `Send`. Every queue of every disk is on this iothread;
/// `spec.iothreads` must be 1 ([`run_cell_on_iothreads`] runs several).
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
    if spec.iothreads != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "run_cell runs one iothread (the calling thread), not {}: use run_cell_on_iothreads",
                spec.iothreads
            ),
        ));
    }
    let mut rig = Rig::new(images, spec)?;
    let ctx = AioContext::new(monitor)?;
    let served = Served::set_up(&ctx, engine, &spec, rig.places(0))?;
    // Before the guests start, as `run_cell_on_iothreads` reads it: their CPU all counts.
    let process0 = process_cpu_seconds();
    let guests = rig.spawn_guests(&[], Some(ctx.notify_handle()))?;
    // Drive: the loop, until every guest is done (each wakes it as it finishes).
    let cpu0 = thread_cpu_seconds();
    while rig.finished.load(Ordering::Acquire) < spec.active {
        ctx.poll(true);
    }
    let figures = served.collect(&ctx, cpu0);
    let stats = Rig::join(guests)?;
    let process_cpu_s = process_cpu_seconds() - process0;
    Ok(rig.result(vec![figures], stats, process_cpu_s))
}

/// Runs one cell on `images` (at least `spec.disks`; the first `spec.active` are driven) with
/// `spec.iothreads` iothreads ([`aio_loop::IoThread`]s named `iothread0`, `iothread1`, ...):
/// `build(t)` makes iothread `t`'s monitor and engine on that thread (so `!Send` ones work),
/// and the queues are spread over them by [`iothread_of`]. With `cpus` non-empty, iothread `t`
/// is pinned to CPU `cpus[t % cpus.len()]` ([`crate::cpus::iothread_cpu`]) before it builds
/// anything, so the threads its engine starts later (the pool's workers) run there too, and
/// the guests to the CPUs the iothreads leave ([`crate::cpus::guest_cpus`]).
pub fn run_cell_on_iothreads<L, E, B>(
    build: B,
    images: &[DiskImage],
    spec: CellSpec,
    cpus: &[usize],
) -> io::Result<CellResult>
where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
    B: Fn(usize) -> io::Result<(L, E)> + Send + Sync + 'static,
{
    let mut rig = Rig::new(images, spec)?;
    let build = Arc::new(build);
    // Declared after the rig, so dropped (stopped and joined, their queues and engines
    // dropped) before it, also on an early return.
    let mut iothreads: Vec<IoThread<L, Served<L, E>>> = Vec::with_capacity(spec.iothreads);
    for t in 0..spec.iothreads {
        let (build, places) = (build.clone(), rig.places(t));
        let cpu = crate::cpus::iothread_cpu(cpus, t);
        let iothread = IoThread::spawn(&format!("iothread{t}"), move || -> io::Result<_> {
            if let Some(c) = cpu {
                crate::cpus::pin_to(&[c]).map_err(io::Error::other)?;
            }
            let (monitor, engine) = build(t)?;
            let ctx = AioContext::new(monitor)?;
            let served = Served::set_up(&ctx, engine, &spec, places)?;
            Ok((ctx, served))
        })
        .map_err(io::Error::from)?;
        iothreads.push(iothread);
    }
    let cpu0 = iothreads
        .iter()
        .map(|t| t.call(|_, _| thread_cpu_seconds()))
        .collect::<Result<Vec<f64>, _>>()
        .map_err(io::Error::from)?;
    let process0 = process_cpu_seconds();
    // Drive: the iothreads run their loops; the guests run until their deadline.
    let guest_cpus = crate::cpus::guest_cpus(cpus, spec.iothreads);
    let stats = Rig::join(rig.spawn_guests(&guest_cpus, None)?)?;
    let process_cpu_s = process_cpu_seconds() - process0;
    let mut per_iothread = Vec::with_capacity(iothreads.len());
    for (t, c0) in iothreads.iter().zip(cpu0) {
        let figures = t
            .call(move |ctx, served: &Served<L, E>| served.collect(ctx, c0))
            .map_err(io::Error::from)?;
        per_iothread.push(figures);
    }
    for t in iothreads {
        t.stop().map_err(io::Error::from)?;
    }
    Ok(rig.result(per_iothread, stats, process_cpu_s))
}
