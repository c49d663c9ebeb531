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
mod error;
mod events;
mod exports;
mod handoff;
mod iothreads;
mod nbd;
mod nbd_bitmaps;
mod nbd_spec;
mod nodes;
mod open;
pub(crate) mod rbd;
mod stop;
mod values;

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio_core::EventLoop;
use aio_loop::AioContext;

pub use aio_vhost_user_blk::server::DiskSocket;
pub use config::{BadDiskSpec, Config, DiskSpec};
pub use error::{DaemonError, DiskError, NbdError};
pub use events::{Event, EventQueue};
pub use exports::{ExportKind, Exports};
pub use iothreads::{engine_options, IoThreadSet};
pub use nbd::NbdService;
pub use nbd_bitmaps::{BitmapLookup, ExportBitmapError};
pub use nbd_spec::{NbdBitmapSpec, NbdExportSpec, NbdServerSpec, NbdTlsSpec};
#[cfg(feature = "cli")]
pub(crate) use nodes::open_node_image;
pub use nodes::NodeImages;
pub use stop::StopHandle;
#[cfg(feature = "cli")]
pub(crate) use values::parse_size;

use open::open_disk;

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
    /// Where any module sends QEMU's events; a monitor attaches to deliver them.
    pub events: EventQueue,
    /// The images the block nodes hold (a monitor's `blockdev-add` fills it); closed after
    /// the exports when the daemon stops.
    pub nodes: NodeImages,
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
            spec: d.label(),
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

    let events = EventQueue::new();
    let exports = Exports::new(threads.clone(), events.clone());
    let mut result = Ok(());
    for (d, device) in config.disks.iter().zip(devices) {
        if let Err(e) = exports.serve(&ctx, d.clone(), device) {
            result = Err(e);
            break;
        }
    }
    let nbd: NbdSlot = NbdSlot::default();
    let nodes = NodeImages::new();
    if result.is_ok() {
        match start_nbd(&ctx, config, &exports, &threads, &events) {
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
            events: events.clone(),
            nodes: nodes.clone(),
        };
        result = ready(&control).map_err(start_error("monitor"));
    }
    if result.is_ok() {
        while !stop.is_stopped() {
            ctx.poll(true);
        }
        // What the last iteration sent is delivered before the end.
        ctx.poll(false);
    }
    events.detach(&ctx);
    // NBD clients end first (their requests drained), then every disk as one removed at run
    // time does: its queues drain, then what its image caches (qcow2 metadata) is written.
    let service = nbd.borrow_mut().take();
    if let Some(n) = service {
        n.stop(&ctx);
    }
    exports.remove_all(&ctx);
    // Then the nodes' own images (a qcow2 node's metadata and bitmaps written back).
    nodes.close_all();
    drop(ctx);
    threads.stop_all()?;
    result
}

/// A `{node, name}` bitmap of a command line export: the daemon knows its nodes only once
/// its monitor runs, so such an export is `block-export-add`'s.
fn command_line_lookup(
    node: &str,
    name: &str,
) -> Result<Arc<aio_block::bitmap::DirtyBitmap>, String> {
    Err(format!(
        "bitmap '{name}' of node '{node}': a bitmap of another node is served by \
         block-export-add, not on the command line"
    ))
}

/// Starts the NBD server and offers its exports, if the configuration has them.
fn start_nbd(
    ctx: &AioContext<Box<dyn EventLoop>>,
    config: &Config,
    exports: &Exports,
    threads: &IoThreadSet,
    events: &EventQueue,
) -> Result<Option<Rc<NbdService>>, DaemonError> {
    let Some(spec) = &config.nbd else {
        return match config.nbd_exports.is_empty() {
            true => Ok(None),
            false => Err(NbdError::NoServer.into()),
        };
    };
    let service = Rc::new(NbdService::start(ctx, spec, threads, events)?);
    for e in &config.nbd_exports {
        if let Err(err) = service.add(e.clone(), exports, None, &command_line_lookup) {
            service.stop(ctx);
            return Err(err.into());
        }
    }
    Ok(Some(service))
}
