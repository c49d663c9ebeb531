//! The disks a running daemon serves, as its control loop holds them: each a socket, its
//! device and the spec it came from. A monitor (QMP) adds and ends disks through
//! [`Exports`] while the daemon runs; the daemon ends the rest when it stops.
//!
//! This module owns the list and the order of an export's end (the socket closed and its
//! frontend drained first, then the image's cached metadata written); opening an image and
//! serving a socket are `open_disk`'s and [`DiskSocket`]'s.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use aio_core::{EventLoop, IoEngine};
use aio_loop::AioContext;
use aio_virtio_blk::device::{BlockDevice, ResizeError};

use super::config::DiskSpec;
use super::distinct;
use super::error::{DaemonError, DiskError};
use super::events::EventQueue;
use super::iothreads::IoThreadSet;
use super::open::{disk_options, open_disk};
use aio_vhost_user_blk::server::DiskSocket;
use aio_vhost_user_blk::vhost::DiskIndex;

/// The kinds of export a disk is served through, by the names QEMU gives them
/// (`--export type=`, `query-block-exports`' `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExportKind {
    /// A vhost-user-blk socket (`aio-vhost-user-blk`), as QEMU's
    /// `block/export/vhost-user-blk-server.c`.
    VhostUserBlk,
    /// An export of the NBD server (`aio-nbd`), as QEMU's `nbd/server.c`.
    Nbd,
}

impl ExportKind {
    /// Every kind served.
    pub const ALL: [ExportKind; 2] = [ExportKind::VhostUserBlk, ExportKind::Nbd];

    /// QEMU's name of the kind.
    pub fn qemu_type(self) -> &'static str {
        match self {
            ExportKind::VhostUserBlk => "vhost-user-blk",
            ExportKind::Nbd => "nbd",
        }
    }

    /// The kind QEMU's name names, if it is served.
    pub fn from_qemu_type(name: &str) -> Option<ExportKind> {
        ExportKind::ALL.into_iter().find(|k| k.qemu_type() == name)
    }
}

type Loop = Box<dyn EventLoop>;
type Engine = Box<dyn IoEngine>;

/// One disk being served.
struct Served {
    spec: DiskSpec,
    socket: Rc<DiskSocket<Loop, Engine>>,
    device: Arc<BlockDevice>,
}

struct Inner {
    /// By number (a disk's number is its key on the iothreads: never reused); None once ended.
    disks: RefCell<Vec<Option<Served>>>,
    iothreads: IoThreadSet,
    /// Where a disk's end is announced (`BLOCK_EXPORT_DELETED`, for one with an id).
    events: EventQueue,
    /// The queues numbered so far (where the next disk's queue 0 takes the iothreads up).
    queues: RefCell<usize>,
}

/// The index of disk `number`, whose queue 0 follows the `queues_before` queues of the disks
/// before it (where [`iothread_of`](aio_virtio_blk::dataplane::iothread_of) starts it).
fn disk_index(number: usize, queues_before: usize, spec: &DiskSpec) -> DiskIndex {
    DiskIndex {
        number: u32::try_from(number).unwrap_or(u32::MAX),
        first_queue: queues_before,
        iothread: spec.iothread.map(usize::from),
    }
}

/// The disks a running daemon serves; cheap to clone, used on the control loop's thread.
#[derive(Clone)]
pub struct Exports(Rc<Inner>);

impl Exports {
    pub(super) fn new(iothreads: IoThreadSet, events: EventQueue) -> Self {
        Exports(Rc::new(Inner {
            disks: RefCell::new(Vec::new()),
            iothreads,
            events,
            queues: RefCell::new(0),
        }))
    }

    /// Opens `spec`'s image and serves its socket on `ctx`; returns the disk's number. Refused
    /// (nothing served) when it collides with a disk being served or its image is refused.
    pub fn add(&self, ctx: &AioContext<Loop>, spec: DiskSpec) -> Result<usize, DaemonError> {
        let mut all = self.specs();
        all.push(spec.clone());
        distinct::check(&all)?;
        let iothreads = self.0.iothreads.len();
        let set = &self.0.iothreads;
        if let Some(k) = spec.iothread.filter(|&k| !set.is_running(usize::from(k))) {
            return Err(DaemonError::Disk {
                spec: spec.label(),
                source: DiskError::NoSuchIoThread {
                    iothread: k,
                    iothreads: u16::try_from(iothreads).unwrap_or(u16::MAX),
                },
            });
        }
        let device = Arc::new(open_disk(&spec)?);
        self.serve(ctx, spec, device)
    }

    /// [`add`](Self::add), over `image` when another export (an NBD export) already has the
    /// disk's image open: the disk shares it instead of opening it again.
    pub fn add_sharing(
        &self,
        ctx: &AioContext<Loop>,
        spec: DiskSpec,
        image: Option<Arc<aio_block::Image>>,
    ) -> Result<usize, DaemonError> {
        let Some(image) = image else {
            return self.add(ctx, spec);
        };
        let mut all = self.specs();
        all.push(spec.clone());
        distinct::check(&all)?;
        let device =
            BlockDevice::on_image(image, disk_options(&spec)).map_err(|e| DaemonError::Disk {
                spec: spec.label(),
                source: e.into(),
            })?;
        self.serve(ctx, spec, Arc::new(device))
    }

    /// Serves an opened `device` as `spec` says.
    pub(super) fn serve(
        &self,
        ctx: &AioContext<Loop>,
        spec: DiskSpec,
        device: Arc<BlockDevice>,
    ) -> Result<usize, DaemonError> {
        let number = self.0.disks.borrow().len();
        let index = disk_index(number, *self.0.queues.borrow(), &spec);
        let socket = DiskSocket::serve(
            ctx,
            index,
            &spec.socket,
            device.clone(),
            self.0.iothreads.handles(),
        )
        .map_err(|e| DaemonError::Disk {
            spec: spec.label(),
            source: DiskError::Socket(e),
        })?;
        *self.0.queues.borrow_mut() += usize::from(spec.queues);
        self.0.disks.borrow_mut().push(Some(Served {
            spec,
            socket,
            device,
        }));
        Ok(number)
    }

    /// The specs of the disks being served.
    pub fn specs(&self) -> Vec<DiskSpec> {
        self.0
            .disks
            .borrow()
            .iter()
            .flatten()
            .map(|s| s.spec.clone())
            .collect()
    }

    /// The open image of a disk that serves the image at `path` (the same one whatever path
    /// names it, as the collision check tells), to share with another export.
    pub fn image_of(&self, path: &std::path::Path) -> Option<Arc<aio_block::Image>> {
        let wanted = distinct::image_key(path)?;
        let disks = self.0.disks.borrow();
        disks
            .iter()
            .flatten()
            .find(|s| {
                !s.spec.is_null() && distinct::image_key(&s.spec.image).as_ref() == Some(&wanted)
            })
            .map(|s| s.device.image().clone())
    }

    /// Disk `number`'s device (None: no such disk being served).
    pub fn device(&self, number: usize) -> Option<Arc<BlockDevice>> {
        let disks = self.0.disks.borrow();
        Some(disks.get(number)?.as_ref()?.device.clone())
    }

    /// Resizes disk `number` to `bytes` (see [`BlockDevice::resize`]) and tells its
    /// frontend, if one is connected and gave a backend channel: `Some(Ok(true))` when one
    /// was told. None: no such disk being served. The disk is resized even when telling the
    /// frontend fails (printed); the frontend then sees the size at its next connection.
    pub fn resize(&self, number: usize, bytes: u64) -> Option<Result<bool, ResizeError>> {
        let disks = self.0.disks.borrow();
        let served = disks.get(number)?.as_ref()?;
        if let Err(e) = served.device.resize(bytes) {
            return Some(Err(e));
        }
        Some(Ok(match served.socket.announce_config_change() {
            Ok(told) => told,
            Err(e) => {
                eprintln!(
                    "aio-storage-daemon: {}: telling the frontend of the new size: {e}",
                    served.spec.socket.display()
                );
                false
            }
        }))
    }

    /// Whether disk `number` has a frontend connected (None: no such disk being served).
    pub fn connected(&self, number: usize) -> Option<bool> {
        let disks = self.0.disks.borrow();
        let served = disks.get(number)?.as_ref()?;
        Some(served.socket.is_connected())
    }

    /// Ends disk `number`: its socket closed and removed, its frontend (if any) disconnected
    /// once its requests completed, its image's cached metadata written, and then, for a disk
    /// with an [`id`](DiskSpec::id), QEMU's `BLOCK_EXPORT_DELETED` sent. False when there is
    /// no such disk being served.
    pub fn remove(&self, ctx: &AioContext<Loop>, number: usize) -> bool {
        let served = match self.0.disks.borrow_mut().get_mut(number) {
            Some(slot) => slot.take(),
            None => None,
        };
        let Some(served) = served else {
            return false;
        };
        served.socket.close(ctx);
        if let Err(e) = served.device.close() {
            eprintln!(
                "aio-storage-daemon: {}: closing: {e}",
                served.spec.image.display()
            );
        }
        self.0.events.export_deleted(served.spec.id);
        true
    }

    /// Ends every disk, in order (the daemon's stop).
    pub(super) fn remove_all(&self, ctx: &AioContext<Loop>) {
        let count = self.0.disks.borrow().len();
        for number in 0..count {
            self.remove(ctx, number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aio_virtio_blk::dataplane::iothread_of;

    /// The indexes of `disks` served in order.
    fn indexes(disks: &[DiskSpec]) -> Vec<DiskIndex> {
        let mut before = 0;
        (0..)
            .zip(disks)
            .map(|(n, d)| {
                let index = disk_index(n, before, d);
                before += usize::from(d.queues);
                index
            })
            .collect()
    }

    #[test]
    fn one_queue_disks_spread_over_the_iothreads_unless_pinned() {
        let disk = |q: u16, extra: &str| -> DiskSpec {
            format!("socket=/s{q},image=/i,queues={q}{extra}")
                .parse()
                .unwrap()
        };
        // Four one-queue disks on four iothreads: one each (not all on the first).
        let on: Vec<usize> = indexes(&[disk(1, ""), disk(1, ""), disk(1, ""), disk(1, "")])
            .iter()
            .map(|d| iothread_of(d.first_queue, 0, 4))
            .collect();
        assert_eq!(on, [0, 1, 2, 3]);
        // A two-queue disk, then a one-queue disk, on two iothreads: the queues take them in
        // turn, so the second disk starts where the first left off.
        let idx = indexes(&[disk(2, ""), disk(1, ",iothread=1")]);
        assert_eq!((idx[1].number, idx[1].first_queue), (1, 2));
        assert_eq!(
            [
                iothread_of(idx[0].first_queue, 0, 2),
                iothread_of(idx[0].first_queue, 1, 2),
            ],
            [0, 1]
        );
        assert_eq!((idx[0].iothread, idx[1].iothread), (None, Some(1)));
    }
}
