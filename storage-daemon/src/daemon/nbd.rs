//! The daemon's NBD server: one listening socket on the control loop, its clients served on
//! the iothreads (each connection on one, with that iothread's engine), and its exports, each
//! an image of its own or one a vhost-user-blk disk serves too (a backup reads while the VM
//! writes, within that image's locks).
//!
//! This module owns the server's life and its export list (what QMP's `nbd-server-*` and
//! `block-export-*` change); the protocol is `aio-nbd`'s.
//!
//! * An export of an image a disk serves shares the disk's open image (never a second open,
//!   which its own lock would refuse); a writable export needs a writable disk.
//! * Removing an export stops new clients finding it, shuts its clients down, waits for
//!   their requests, then closes its image if it is the export's own.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use aio_block::{Image, ImageOptions};
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_nbd::{Limits, NbdExport, NbdServer};

use super::distinct::image_key;
use super::error::NbdError;
use super::events::EventQueue;
use super::exports::Exports;
use super::iothreads::IoThreadSet;
use super::nbd_bitmaps::{serve_bitmaps, BitmapLookup, ServedBitmaps};
use super::nbd_spec::{NbdExportSpec, NbdServerSpec};

/// How long a stop waits for clients' requests in flight.
const DRAIN: Duration = Duration::from_secs(30);

/// One export being offered.
struct Offered {
    spec: NbdExportSpec,
    image: Arc<Image>,
    /// The image is a disk's: the disk closes it.
    borrowed: bool,
    /// The dirty bitmaps it serves, held busy until it is removed (kept for its drop).
    _bitmaps: ServedBitmaps,
}

/// The running NBD server and its exports; lives on the control loop's thread.
pub struct NbdService {
    server: Rc<NbdServer>,
    spec: NbdServerSpec,
    offered: RefCell<Vec<Offered>>,
    /// The iothreads exports name (`iothread=`): clients go to these in turn, or to every
    /// iothread when none is named.
    pins: Rc<RefCell<Vec<usize>>>,
    iothreads: IoThreadSet,
    /// Where an export's end is announced (`BLOCK_EXPORT_DELETED`, for one with an id).
    events: EventQueue,
}

impl std::fmt::Debug for NbdService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdService")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl NbdService {
    /// Listens as `spec` says; clients go to the iothreads in turn. The end of an export
    /// with an [`id`](NbdExportSpec::id) is announced on `events` (`BLOCK_EXPORT_DELETED`).
    pub fn start<L: EventLoop + 'static>(
        ctx: &AioContext<L>,
        spec: &NbdServerSpec,
        iothreads: &IoThreadSet,
        events: &EventQueue,
    ) -> Result<Self, NbdError> {
        let limits = Limits {
            handshake_timeout: spec.handshake,
            ..Limits::default()
        };
        let listen = |source| NbdError::Listen {
            addr: spec.addr.to_string(),
            source,
        };
        let tls = match &spec.tls {
            Some(t) => Some(aio_nbd::TlsCreds::from_qemu_dir(&t.dir, t.verify_peer)?),
            None => None,
        };
        let exports = aio_nbd::ExportSet::new();
        let server = NbdServer::bind_tls(&spec.addr, exports, limits, spec.max_connections, tls)
            .map_err(listen)?;
        let threads = iothreads.clone();
        let next = Cell::new(0usize);
        let pins: Rc<RefCell<Vec<usize>>> = Rc::default();
        let pinned = pins.clone();
        server
            .listen(ctx, move |client| {
                let handles = threads.handles();
                let candidates: Vec<usize> = match pinned.borrow().as_slice() {
                    [] => (0..handles.len()).collect(),
                    named => named.to_vec(),
                };
                for _ in 0..candidates.len() {
                    let k = candidates[next.get() % candidates.len()];
                    next.set(next.get().wrapping_add(1));
                    if threads.is_running(k) && k < handles.len() {
                        let _ = handles[k].run(move |ctx, plane| {
                            if let Err(e) = aio_nbd::serve(ctx, plane.engine().clone(), client) {
                                eprintln!("aio-storage-daemon: an NBD client: {e}");
                            }
                        });
                        return;
                    }
                }
            })
            .map_err(listen)?;
        Ok(NbdService {
            server,
            spec: spec.clone(),
            offered: RefCell::new(Vec::new()),
            pins,
            iothreads: iothreads.clone(),
            events: events.clone(),
        })
    }

    /// The server's configuration.
    pub fn spec(&self) -> &NbdServerSpec {
        &self.spec
    }

    /// The TCP port it listens on (the one chosen for port 0).
    pub fn local_port(&self) -> Option<u16> {
        self.server.local_port()
    }

    /// Offers `spec`'s image: `held` (the image its block node holds) if given, else a disk's
    /// if one of `disks` serves it, else opened here; with its dirty bitmaps, held busy until
    /// the export is removed (`lookup` finds a `{node, name}` one).
    pub fn add(
        &self,
        spec: NbdExportSpec,
        disks: &Exports,
        held: Option<Arc<Image>>,
        lookup: BitmapLookup<'_>,
    ) -> Result<(), NbdError> {
        let refuse = |reason: String| NbdError::Export {
            name: spec.name.clone(),
            reason,
        };
        if self
            .offered
            .borrow()
            .iter()
            .any(|o| o.spec.name == spec.name)
        {
            return Err(refuse("an export of that name is already offered".into()));
        }
        if let Some(k) = spec
            .iothread
            .filter(|&k| !self.iothreads.is_running(usize::from(k)))
        {
            return Err(refuse(format!("iothread={k}: no such iothread is running")));
        }
        let shared = match held {
            Some(image) => Some(image),
            None if spec.is_null() => None,
            None => self
                .image_of(&spec.image)
                .or_else(|| disks.image_of(&spec.image)),
        };
        let (image, borrowed) = match shared {
            Some(image) => (image, true),
            None => {
                let options = ImageOptions::new(spec.format)
                    .read_only(!spec.writable)
                    .locking(spec.locking);
                let opened =
                    super::nodes::open_node_image(&spec.image, options, spec.size, spec.inactive)
                        .map_err(|e| refuse(format!("{}: {e}", spec.image.display())))?;
                (Arc::new(opened), false)
            }
        };
        let mut export = NbdExport::new(spec.name.clone(), image.clone())
            .and_then(|e| e.writable(spec.writable))
            .map_err(|e| refuse(e.to_string()))?;
        let bitmaps = serve_bitmaps(
            &spec.bitmaps,
            &image,
            (spec.writable, spec.writable_node),
            lookup,
        )?;
        for bitmap in &bitmaps.bitmaps {
            export = export.dirty_bitmap(bitmap.clone());
        }
        if let Some(d) = &spec.description {
            export = export
                .description(d.clone())
                .map_err(|e| refuse(e.to_string()))?;
        }
        export = export
            .multi_conn(spec_allows_multi_conn(&self.spec))
            .allocation_depth(spec.allocation_depth);
        self.server
            .exports()
            .insert(export)
            .map_err(|e| refuse(e.to_string()))?;
        self.offered.borrow_mut().push(Offered {
            spec,
            image,
            borrowed,
            _bitmaps: bitmaps,
        });
        self.repin();
        Ok(())
    }

    /// The iothreads the exports name, again.
    fn repin(&self) {
        let mut pins: Vec<usize> = self
            .offered
            .borrow()
            .iter()
            .filter_map(|o| o.spec.iothread.map(usize::from))
            .collect();
        pins.sort_unstable();
        pins.dedup();
        *self.pins.borrow_mut() = pins;
    }

    /// The exports offered, in order.
    pub fn specs(&self) -> Vec<NbdExportSpec> {
        self.offered
            .borrow()
            .iter()
            .map(|o| o.spec.clone())
            .collect()
    }

    /// The open image of an export that serves the image at `path` (the same one whatever
    /// path names it, as the collision check tells), for a disk to share.
    pub fn image_of(&self, path: &Path) -> Option<Arc<Image>> {
        let wanted = image_key(path)?;
        let offered = self.offered.borrow();
        offered
            .iter()
            .find(|o| !o.spec.is_null() && image_key(&o.spec.image).as_ref() == Some(&wanted))
            .map(|o| o.image.clone())
    }

    /// The image export `name` serves.
    pub fn image(&self, name: &str) -> Option<Arc<Image>> {
        let offered = self.offered.borrow();
        offered
            .iter()
            .find(|o| o.spec.name == name)
            .map(|o| o.image.clone())
    }

    /// Clients connected (all exports, and those still negotiating).
    pub fn clients(&self) -> usize {
        self.server.clients().count()
    }

    /// Clients using export `name`.
    pub fn clients_on(&self, name: &str) -> usize {
        self.server.clients().count_on(name)
    }

    /// Stops offering export `name`: its clients are shut down and waited for, then its
    /// own image is closed. False: no such export.
    pub fn remove(&self, name: &str) -> bool {
        let Some(at) = self
            .offered
            .borrow()
            .iter()
            .position(|o| o.spec.name == name)
        else {
            return false;
        };
        self.server.exports().remove(name);
        self.server.clients().shut_down(Some(name));
        if !self.server.clients().wait_gone(Some(name), DRAIN) {
            eprintln!(
                "aio-storage-daemon: NBD export '{name}': clients still busy after {DRAIN:?}"
            );
        }
        let offered = self.offered.borrow_mut().remove(at);
        let id = offered.spec.id.clone();
        self.close_if_unused(offered);
        self.repin();
        self.events.export_deleted(id);
        true
    }

    fn close_if_unused(&self, offered: Offered) {
        let still = self
            .offered
            .borrow()
            .iter()
            .any(|o| Arc::ptr_eq(&o.image, &offered.image));
        if offered.borrowed || still {
            return;
        }
        if let Err(e) = offered.image.close() {
            eprintln!(
                "aio-storage-daemon: NBD export '{}': closing: {e}",
                offered.spec.name
            );
        }
    }

    /// Stops the server: no new clients, every client shut down and waited for, every
    /// export's own image closed.
    pub fn stop<L: EventLoop + 'static>(&self, ctx: &AioContext<L>) {
        self.server.stop(ctx);
        if !self.server.clients().wait_gone(None, DRAIN) {
            eprintln!("aio-storage-daemon: NBD clients still busy after {DRAIN:?}");
        }
        let all: Vec<Offered> = self.offered.borrow_mut().drain(..).collect();
        let ids: Vec<Option<String>> = all.iter().map(|o| o.spec.id.clone()).collect();
        for o in all.into_iter().rev() {
            self.server.exports().remove(&o.spec.name);
            self.close_if_unused(o);
        }
        for id in ids {
            self.events.export_deleted(id);
        }
    }
}

/// Whether clients are told every connection sees every other's writes: true unless the
/// server takes one client at a time (as QEMU).
fn spec_allows_multi_conn(spec: &NbdServerSpec) -> bool {
    spec.max_connections != Some(1)
}
