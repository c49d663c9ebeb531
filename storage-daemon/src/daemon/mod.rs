//! The daemon as a library: a [`Config`]'s disks served as vhost-user-blk devices on aio-rs
//! iothreads until a [`StopHandle`] says stop.
//!
//! This module owns the daemon's life: open the images, start the iothreads (each an
//! [`aio_loop::IoThread`] with its own engine and fd monitor, busy polling at the
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
mod exports;
mod handoff;
mod iothreads;
mod nbd;
mod nbd_spec;
pub(crate) mod rbd;

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use aio_core::{EventLoop, IoEngine};
use aio_loop::{AioContext, IoThread, NotifyHandle};

pub use aio_vhost_user_blk::server::DiskSocket;
#[cfg(feature = "cli")]
pub(crate) use config::parse_size;
pub use config::{BadDiskSpec, Config, DiskSpec};
pub use exports::{ExportKind, Exports};
pub use iothreads::IoThreadSet;
pub use nbd::{NbdError, NbdService};
pub use nbd_spec::{NbdExportSpec, NbdServerSpec, NbdTlsSpec};

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
    IoThread(#[from] aio_loop::IoThreadError),
    /// The NBD server or one of its exports could not be served.
    #[error(transparent)]
    Nbd(#[from] NbdError),
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
/// One of the daemon's iothreads.
type Worker = IoThread<Box<dyn EventLoop>, Plane>;

/// The daemon's engines: each with a thread pool behind it for the discards and write-zeroes
/// it refuses, as QEMU sends them to its thread pool with `aio=native`.
pub fn engine_options() -> aio::EngineOptions {
    aio::EngineOptions::default().with_fallback_pool(true)
}

fn start_error(what: &'static str) -> impl FnOnce(io::Error) -> DaemonError {
    move |source| DaemonError::Start { what, source }
}

/// Serves `config`'s disks on the calling thread until `stop` says stop, then drains every
/// connection, removes the sockets and stops the iothreads.
pub fn run(config: &Config, stop: &StopHandle) -> Result<(), DaemonError> {
    run_with(config, stop, |_| Ok(()))
}

/// The running daemon as [`run_with`]'s `ready` sees it: the control loop, where a monitor
/// puts its handlers, and the disks and iothreads it may look at or change.
pub struct Control<'a> {
    /// The control loop (the calling thread's): the vhost-user sockets' handlers are here.
    pub ctx: &'a AioContext<Box<dyn EventLoop>>,
    /// The disks being served.
    pub exports: Exports,
    /// The iothreads, by number (a monitor may add and remove some).
    pub iothreads: IoThreadSet,
    /// What stops the daemon (QMP's `quit`).
    pub stop: StopHandle,
    /// The NBD server, if one runs (a monitor may start and stop one).
    pub nbd: NbdSlot,
}

/// Where the running NBD server is kept: the daemon stops whatever is there when it stops.
pub type NbdSlot = Rc<std::cell::RefCell<Option<Rc<NbdService>>>>;

/// [`run`], calling `ready` once every socket listens, on the control loop's thread, before
/// the loop runs: a monitor sets itself up there, and a daemonized process tells its parent
/// (as qemu-storage-daemon's `--daemonize` does). An error from `ready` stops the daemon.
pub fn run_with(
    config: &Config,
    stop: &StopHandle,
    ready: impl FnOnce(&Control) -> io::Result<()>,
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
    let threads = IoThreadSet::start(config)?;
    let monitor = config
        .fdmon
        .build()
        .map_err(|e| start_error("fd monitor")(e.into()))?
        .built;
    let ctx = AioContext::new(monitor).map_err(|e| start_error("control loop")(e.into()))?;
    stop.attach(ctx.notify_handle());

    let exports = Exports::new(threads.clone());
    let mut result = Ok(());
    for (d, device) in config.disks.iter().zip(devices) {
        if let Err(e) = exports.serve(&ctx, d.clone(), device) {
            result = Err(e);
            break;
        }
    }
    let nbd: NbdSlot = NbdSlot::default();
    if result.is_ok() {
        match start_nbd(&ctx, config, &exports, &threads) {
            Ok(service) => *nbd.borrow_mut() = service,
            Err(e) => result = Err(e),
        }
    }
    if result.is_ok() {
        let control = Control {
            ctx: &ctx,
            exports: exports.clone(),
            iothreads: threads.clone(),
            stop: stop.clone(),
            nbd: nbd.clone(),
        };
        result = ready(&control).map_err(start_error("monitor"));
    }
    if result.is_ok() {
        while !stop.is_stopped() {
            ctx.poll(true);
        }
    }
    // NBD clients end first (their requests drained), then every disk as one removed at run
    // time does: its queues drain, then what its image caches (qcow2 metadata) is written.
    let service = nbd.borrow_mut().take();
    if let Some(n) = service {
        n.stop(&ctx);
    }
    exports.remove_all(&ctx);
    drop(ctx);
    threads.stop_all()?;
    result
}

/// Starts the NBD server and offers its exports, if the configuration has them.
fn start_nbd(
    ctx: &AioContext<Box<dyn EventLoop>>,
    config: &Config,
    exports: &Exports,
    threads: &IoThreadSet,
) -> Result<Option<Rc<NbdService>>, DaemonError> {
    let Some(spec) = &config.nbd else {
        return match config.nbd_exports.is_empty() {
            true => Ok(None),
            false => Err(NbdError::NoServer.into()),
        };
    };
    let service = Rc::new(NbdService::start(ctx, spec, threads)?);
    for e in &config.nbd_exports {
        if let Err(err) = service.add(e.clone(), exports) {
            service.stop(ctx);
            return Err(err.into());
        }
    }
    Ok(Some(service))
}

/// What the device of `d` is made with.
fn disk_options(d: &DiskSpec) -> DiskOptions {
    DiskOptions {
        read_only: d.read_only,
        serial: d.serial.clone(),
        queues: d.queues,
        format: d.format,
        locking: d.locking,
        share_rw: d.share_rw,
    }
}

/// Opens one `--disk`'s image (or makes the null device), logging a qcow2 image's backing
/// chain.
fn open_disk(d: &DiskSpec) -> Result<BlockDevice, DaemonError> {
    let options = disk_options(d);
    let device = match d.size {
        Some(size) if d.is_null() => BlockDevice::null(size, options),
        _ if rbd::is_rbd(&d.image) => rbd::open_image(&d.image, options.image_options())
            .map_err(DeviceError::Image)
            .and_then(|image| BlockDevice::on_image(Arc::new(image), options)),
        _ => handoff::open_image(d, options),
    }
    .map_err(|e| DaemonError::Disk {
        spec: d.socket.display().to_string(),
        source: e.into(),
    })?;
    if device.is_dirty() {
        eprintln!(
            "aio-storage-daemon: warning: {}: the qcow2 image is dirty (its refcounts are stale \
             after a crash with lazy_refcounts=on): served read-only; `qemu-img check -r all {}` \
             repairs it, then it is served writable",
            d.image.display(),
            d.image.display()
        );
    }
    let chain = device.backing_chain();
    if !chain.is_empty() {
        let names: Vec<_> = chain.iter().map(|p| p.display().to_string()).collect();
        eprintln!(
            "aio-storage-daemon: {}: {} image, backing chain {}",
            d.image.display(),
            device.format_name(),
            names.join(" <- ")
        );
    }
    Ok(device)
}
