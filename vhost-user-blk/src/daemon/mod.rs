//! The daemon as a library: a [`Config`]'s disks served as vhost-user-blk devices on aio-rs
//! iothreads until a [`StopHandle`] says stop.
//!
//! This module owns the daemon's life: open the images, start the iothreads (each an
//! [`aio_core::IoThread`] with its own engine and fd monitor, busy polling at the
//! configured window), serve every socket on a control loop on the calling thread, and end
//! cleanly when stopped (every connection drained, sockets removed). It installs no signal
//! handler and parses no command line: the binary does ([`crate::cli`]), so a program may
//! run the daemon more than once, or beside its own work.
//!
//! Threads: the calling thread's `AioContext` holds the listening sockets and the
//! connections (vhost-user messages); each iothread's `AioContext` holds its queues' kick fds
//! and its engine's completions. The queues of every disk, numbered in order, take the
//! iothreads in turn ([`aio_virtio_blk::dataplane::iothread_of`]).

mod config;
mod distinct;
mod socket;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use aio_core::{AioContext, EventLoop, IoEngine, IoThread, NotifyHandle};

pub(crate) use config::parse_size;
pub use config::{BadDiskSpec, Config, DiskSpec};
pub use socket::DiskSocket;

use crate::vhost::DiskIndex;
use aio_virtio_blk::dataplane::DataPlane;
use aio_virtio_blk::device::{BlockDevice, DeviceError, DiskOptions};

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// A disk's image could not be opened or served as it is.
    #[error("--disk {spec}: {source}")]
    Disk {
        /// The disk's socket path.
        spec: String,
        /// Why.
        #[source]
        source: DiskError,
    },
    /// Two disks collide: one socket, or one image with a writer. It names both.
    #[error("--disk {first} and --disk {second}: {reason}")]
    Conflict {
        /// The earlier disk.
        first: String,
        /// The later one.
        second: String,
        /// How they collide.
        reason: String,
    },
    /// An iothread could not start (its backends were refused) or failed.
    #[error("{0}")]
    IoThread(#[from] aio_core::IoThreadError),
    /// The control loop's backends could not start.
    #[error("{what}: {source}")]
    Start {
        /// What could not start.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Why one disk could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiskError {
    /// The image was refused (it cannot be opened, its size, its format).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Its socket could not be created or watched.
    #[error("socket: {0}")]
    Socket(#[source] io::Error),
    /// It names an iothread the daemon does not have.
    #[error("iothread={iothread}: the daemon has {iothreads} iothreads (numbered from 0)")]
    NoSuchIoThread {
        /// The iothread named.
        iothread: u16,
        /// How many there are.
        iothreads: u16,
    },
}

/// Tells a running [`run`] to stop: `Send + Sync + Clone`, for a signal handler, another
/// thread, or a test. Stopping before `run` starts makes it return as soon as it has started.
#[derive(Debug, Clone, Default)]
pub struct StopHandle {
    inner: Arc<StopInner>,
}

#[derive(Debug, Default)]
struct StopInner {
    stopped: AtomicBool,
    /// The control loop's wake-up, once `run` has one.
    wake: Mutex<Option<NotifyHandle>>,
}

impl StopHandle {
    /// A handle that has not said stop.
    pub fn new() -> Self {
        Self::default()
    }

    /// Says stop and wakes the control loop (async-signal-safe it is not: call it from a
    /// signal-handling thread, as `ctrlc` does, not from a signal handler).
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let wake = self
            .inner
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(wake) = wake.as_ref() {
            wake.notify();
        }
    }

    /// Whether stop was said.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    fn attach(&self, wake: NotifyHandle) {
        *self
            .inner
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(wake);
    }
}

type Plane = DataPlane<Box<dyn EventLoop>, Box<dyn IoEngine>>;

/// The daemon's engines: each with a thread pool behind it for the discards and write-zeroes
/// it refuses, as QEMU sends them to its thread pool with `aio=native`.
pub fn engine_options() -> aio::EngineOptions {
    aio::EngineOptions::default().with_fallback_pool(true)
}

/// Each disk's number and the number of its queue 0 among every disk's queues, in order.
fn disk_indexes(disks: &[DiskSpec]) -> Vec<DiskIndex> {
    let mut first_queue = 0;
    (0..)
        .zip(disks)
        .map(|(number, d)| {
            let index = DiskIndex {
                number,
                first_queue,
                iothread: d.iothread.map(usize::from),
            };
            first_queue += usize::from(d.queues);
            index
        })
        .collect()
}

fn start_error(what: &'static str) -> impl FnOnce(io::Error) -> DaemonError {
    move |source| DaemonError::Start { what, source }
}

/// Serves `config`'s disks on the calling thread until `stop` says stop, then drains every
/// connection, removes the sockets and stops the iothreads.
pub fn run(config: &Config, stop: &StopHandle) -> Result<(), DaemonError> {
    run_with(config, stop, || {})
}

/// [`run`], calling `ready` once every socket listens (a daemonized process tells its parent
/// then, as qemu-storage-daemon's `--daemonize` does).
pub fn run_with(
    config: &Config,
    stop: &StopHandle,
    ready: impl FnOnce(),
) -> Result<(), DaemonError> {
    distinct::check(&config.disks)?;
    if let Some(d) = config
        .disks
        .iter()
        .find(|d| d.iothread.is_some_and(|k| k >= config.iothreads.max(1)))
    {
        return Err(DaemonError::Disk {
            spec: d.socket.display().to_string(),
            source: DiskError::NoSuchIoThread {
                iothread: d.iothread.unwrap_or_default(),
                iothreads: config.iothreads.max(1),
            },
        });
    }
    let devices = config
        .disks
        .iter()
        .map(|d| open_disk(d).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let mut threads = Vec::new();
    for k in 0..usize::from(config.iothreads.max(1)) {
        let (engine, fdmon) = (config.engine, config.fdmon);
        let cpu = config.cpus.as_ref().and_then(|c| c.nth_wrapping(k));
        let poll = config
            .iothread_poll
            .get(k)
            .copied()
            .unwrap_or_else(|| config.poll_max_ns.params());
        let thread = IoThread::spawn(&format!("iothread{k}"), move || -> io::Result<_> {
            if let Some(cpu) = cpu {
                aio_core::process::pin_current_thread(&[cpu])?;
            }
            let ctx = AioContext::new(fdmon.build()?.built).map_err(io::Error::from)?;
            ctx.set_poll_params(poll);
            let engine = engine.build(&engine_options())?.built;
            let plane: Plane = DataPlane::new(&ctx, engine).map_err(io::Error::from)?;
            Ok((ctx, plane))
        })?;
        threads.push(thread);
    }
    let handles = Arc::new(threads.iter().map(IoThread::handle).collect::<Vec<_>>());
    let monitor = config
        .fdmon
        .build()
        .map_err(|e| start_error("fd monitor")(e.into()))?
        .built;
    let ctx = AioContext::new(monitor).map_err(|e| start_error("control loop")(e.into()))?;
    stop.attach(ctx.notify_handle());

    let mut sockets = Vec::new();
    let indexes = disk_indexes(&config.disks);
    for ((d, device), disk) in config.disks.iter().zip(&devices).zip(indexes) {
        match DiskSocket::serve(&ctx, disk, &d.socket, device.clone(), handles.clone()) {
            Ok(s) => sockets.push(s),
            Err(e) => {
                sockets
                    .iter()
                    .for_each(|s: &std::rc::Rc<DiskSocket<_, _>>| s.close(&ctx));
                return Err(DaemonError::Disk {
                    spec: d.socket.display().to_string(),
                    source: DiskError::Socket(e),
                });
            }
        }
    }
    ready();
    while !stop.is_stopped() {
        ctx.poll(true);
    }
    for s in &sockets {
        s.close(&ctx);
    }
    drop(sockets);
    for t in threads {
        t.stop()?;
    }
    // Every queue has stopped: what the images cache (qcow2 metadata) is written now.
    for (d, device) in config.disks.iter().zip(&devices) {
        if let Err(e) = device.close() {
            eprintln!("aio-vhost-user-blk: {}: closing: {e}", d.image.display());
        }
    }
    Ok(())
}

/// Opens one `--disk`'s image (or makes the null device), logging a qcow2 image's backing
/// chain.
fn open_disk(d: &DiskSpec) -> Result<BlockDevice, DaemonError> {
    let options = DiskOptions {
        read_only: d.read_only,
        serial: d.serial.clone(),
        queues: d.queues,
        format: d.format,
    };
    let device = match d.size {
        Some(size) if d.is_null() => BlockDevice::null(size, options),
        _ => BlockDevice::open(&d.image, options),
    }
    .map_err(|e| DaemonError::Disk {
        spec: d.socket.display().to_string(),
        source: e.into(),
    })?;
    let chain = device.backing_chain();
    if !chain.is_empty() {
        let names: Vec<_> = chain.iter().map(|p| p.display().to_string()).collect();
        eprintln!(
            "aio-vhost-user-blk: {}: {} image, backing chain {}",
            d.image.display(),
            device.format_name(),
            names.join(" <- ")
        );
    }
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio_virtio_blk::dataplane::iothread_of;

    #[test]
    fn one_queue_disks_spread_over_the_iothreads() {
        let disk =
            |q: u16| -> DiskSpec { format!("socket=/s{q},image=/i,queues={q}").parse().unwrap() };
        // Four one-queue disks on four iothreads: one each (not all on the first).
        let on: Vec<usize> = disk_indexes(&[disk(1), disk(1), disk(1), disk(1)])
            .iter()
            .map(|d| iothread_of(d.first_queue, 0, 4))
            .collect();
        assert_eq!(on, [0, 1, 2, 3]);
        // A two-queue disk, then a one-queue disk, on two iothreads: the queues take them in
        // turn, so the second disk starts where the first left off.
        let idx = disk_indexes(&[disk(2), disk(1)]);
        assert_eq!((idx[1].number, idx[1].first_queue), (1, 2));
        assert_eq!(
            [
                iothread_of(idx[0].first_queue, 0, 2),
                iothread_of(idx[0].first_queue, 1, 2),
                iothread_of(idx[1].first_queue, 0, 2)
            ],
            [0, 1, 0]
        );
    }
}
