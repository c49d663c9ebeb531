//! One cell's run: set up, drive, collect; on the calling thread or on K iothreads.
//!
//! This module owns which thread runs what: the cell's shared parts ([`Rig`]: the guest RAM,
//! every disk's virtqueues, the guests), the one-iothread run on the calling thread (the
//! monitor and engine given), and the run on `spec.iothreads` [`IoThread`]s, each pinned (with
//! `cpus`) and building its monitor, engine and [`Station`] on itself. It never submits I/O
//! (`scsi/host.rs`) or generates load (`scsi/guest.rs`).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use aio_core::engine::IoEngine;
use aio_core::{AioContext, EventLoop, IoThread, NotifyHandle};

use super::guest::{self, GuestDone, GuestPlace, GuestStats};
use super::host::{QueuePlace, Station};
use super::memory::GuestRam;
use super::{check, iothread_of, CellResult, CellSpec, IothreadFigures, Virtqueue};
use crate::cpus::{process_cpu_seconds, thread_cpu_seconds};
use crate::targets::image::DiskImage;

/// A cell's shared parts: the guest RAM and every disk's virtqueues. Whoever runs the cell
/// keeps the rig until every iothread's context is dropped: the guest RAM must outlive every
/// engine that could touch it.
struct Rig<'a> {
    spec: CellSpec,
    images: &'a [DiskImage],
    /// `queues[d][q]`: queue `q` of disk `d`.
    queues: Vec<Vec<Arc<Virtqueue>>>,
    ram: Arc<GuestRam>,
    /// Guests that have finished (or panicked).
    finished: Arc<AtomicUsize>,
}

impl<'a> Rig<'a> {
    /// Checks `spec` against `images`, maps the guest RAM and makes the virtqueues.
    fn new(images: &'a [DiskImage], spec: CellSpec) -> io::Result<Self> {
        check(images, &spec)?;
        let ram = Arc::new(GuestRam::new(spec.active, spec.iodepth, spec.bs)?);
        let queues = (0..spec.disks)
            .map(|_| {
                (0..spec.queues)
                    .map(|_| Virtqueue::new().map(Arc::new))
                    .collect::<io::Result<Vec<_>>>()
            })
            .collect::<io::Result<_>>()?;
        Ok(Rig {
            spec,
            images,
            queues,
            ram,
            finished: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The queues iothread `t` serves ([`iothread_of`]), idle disks' included.
    fn places(&self, t: usize) -> Vec<QueuePlace> {
        let (k, per_disk) = (self.spec.iothreads, self.spec.queues);
        let mut places = Vec::new();
        for (disk, queues) in self.queues.iter().enumerate() {
            for (q, vq) in queues.iter().enumerate() {
                if iothread_of(disk, q, per_disk, k) == t {
                    let image = &self.images[disk];
                    places.push(QueuePlace {
                        disk,
                        vq: vq.clone(),
                        file: image.file().clone(),
                        base: image.base(),
                        driven: disk < self.spec.active,
                    });
                }
            }
        }
        places
    }

    /// A guest thread per active disk, pinned to `cpus` (empty: not pinned); each wakes `wake`
    /// (if any) when it finishes.
    fn spawn_guests(
        &self,
        cpus: &[usize],
        wake: Option<NotifyHandle>,
    ) -> io::Result<Vec<JoinHandle<GuestStats>>> {
        let spec = self.spec;
        (0..spec.active)
            .map(|disk| {
                let image = &self.images[disk];
                let blocks = image.size() / spec.bs as u64;
                let ledger = spec.verify.then(|| image.ledger().cloned()).flatten();
                let place = GuestPlace {
                    cpus: cpus.to_vec(),
                    done: GuestDone::new(self.finished.clone(), wake.clone()),
                };
                guest::spawn(
                    self.queues[disk].clone(),
                    self.ram.clone(),
                    spec,
                    disk,
                    blocks.max(1),
                    ledger,
                    place,
                )
            })
            .collect()
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
        result.interrupts = self
            .queues
            .iter()
            .flatten()
            .map(|vq| vq.interrupts.load(Ordering::Relaxed))
            .sum();
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
    // Dropped in reverse order: the station, the context (and with it the engine), then the
    // rig and its guest RAM.
    let rig = Rig::new(images, spec)?;
    let ctx = AioContext::new(monitor)?;
    let station = Station::set_up(&ctx, engine, &spec, &rig.ram, rig.places(0))?;
    // Before the guests start, as `run_cell_on_iothreads` reads it: their CPU all counts.
    let process0 = process_cpu_seconds();
    let guests = rig.spawn_guests(&[], Some(ctx.notify_handle()))?;
    // Drive: the loop, until every guest is done (each wakes it as it finishes).
    let cpu0 = thread_cpu_seconds();
    while rig.finished.load(Ordering::Acquire) < spec.active {
        ctx.poll(true);
    }
    let figures = IothreadFigures {
        queues: station.queue_count(),
        cpu_s: thread_cpu_seconds() - cpu0,
        counters: ctx.counters(),
    };
    let stats = Rig::join(guests)?;
    let process_cpu_s = process_cpu_seconds() - process0;
    station.tear_down(&ctx);
    Ok(rig.result(vec![figures], stats, process_cpu_s))
}

/// Runs one cell on `images` (at least `spec.disks`; the first `spec.active` are driven) with
/// `spec.iothreads` iothreads ([`aio_core::IoThread`]s named `iothread0`, `iothread1`, ...):
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
    let rig = Rig::new(images, spec)?;
    let build = Arc::new(build);
    // Declared after the rig, so dropped (stopped and joined, their contexts and engines
    // dropped) before it, also on an early return.
    let mut iothreads: Vec<IoThread<L, Station<L, E>>> = Vec::with_capacity(spec.iothreads);
    for t in 0..spec.iothreads {
        let (build, ram, places) = (build.clone(), rig.ram.clone(), rig.places(t));
        let cpu = crate::cpus::iothread_cpu(cpus, t);
        let iothread = IoThread::spawn(&format!("iothread{t}"), move || -> io::Result<_> {
            if let Some(c) = cpu {
                crate::cpus::pin_to(&[c]).map_err(io::Error::other)?;
            }
            let (monitor, engine) = build(t)?;
            let ctx = AioContext::new(monitor)?;
            let station = Station::set_up(&ctx, engine, &spec, &ram, places)?;
            Ok((ctx, station))
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
            .call(move |ctx, station: &Station<L, E>| {
                let figures = IothreadFigures {
                    queues: station.queue_count(),
                    cpu_s: thread_cpu_seconds() - c0,
                    counters: ctx.counters(),
                };
                station.tear_down(ctx);
                figures
            })
            .map_err(io::Error::from)?;
        per_iothread.push(figures);
    }
    for t in iothreads {
        t.stop().map_err(io::Error::from)?;
    }
    Ok(rig.result(per_iothread, stats, process_cpu_s))
}
