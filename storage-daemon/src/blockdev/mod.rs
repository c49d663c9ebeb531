//! The block graph both front ends build: block nodes, objects and exports by their QEMU
//! names, as QEMU's `blockdev.c` and `block/export/export.c` sit between its command line and
//! its monitor.
//!
//! qemu-storage-daemon's command line ([`crate::qsd`]) and QMP ([`crate::qmp`]) turn their
//! input (`--blockdev` / `blockdev-add`, `--object` / `object-add`, `--export` /
//! `block-export-add`, `--nbd-server` / `nbd-server-start`) into the same calls of
//! [`Graph`], and keep no model of their own: the command line resolves the graph into the
//! daemon's [`Config`], QMP changes it while the daemon runs and answers its queries from it.
//!
//! Each kind is one row in one table, and one reader function beside it:
//!
//! | kind | table | rows |
//! | --- | --- | --- |
//! | node drivers | [`node::NODE_DRIVERS`] | `file`, `host_device`, `raw`, `qcow2`, `rbd`, `null-co`, `null-aio` |
//! | object types | [`object::OBJECT_TYPES`] | `iothread`, `tls-creds-x509` |
//! | export drivers | [`export::EXPORT_DRIVERS`] | `vhost-user-blk`, `nbd` |
//!
//! This module owns the graph's rules (names given once, a format node over a node given
//! before, an export's node and iothread looked up, one engine for the daemon); the options of
//! each kind are its file's, one value's syntax `keyval`'s; serving is the daemon's.

pub(crate) mod error;
pub(crate) mod export;
pub(crate) mod keyval;
mod nbd_server;
pub(crate) mod node;
pub(crate) mod object;
pub(crate) mod path;

use std::collections::{BTreeSet, HashMap};

use aio::{Choice, EngineKind};
use aio_loop::{PollMaxNs, PollParams};

use crate::daemon::{Config, DiskSpec, NbdExportSpec, NbdServerSpec, NbdTlsSpec};
use error::QsdError;
use export::{Export, Transport};
use keyval::Opts;
use node::Node;
use object::{IoThreadObject, Object};
use path::absolute;

/// What qemu-storage-daemon's vhost-user-blk export answers to `GET_ID`; ours answers the
/// same, so the guest sees the same disk.
pub const QEMU_EXPORT_SERIAL: &str = "vhost_user_blk";

/// The block nodes, objects and exports given so far, in order (the command line's, then a
/// monitor's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Graph {
    pub(crate) nodes: HashMap<String, Node>,
    /// The `iothread` objects.
    pub(crate) objects: Vec<IoThreadObject>,
    pub(crate) exports: Vec<Export>,
    /// The iothread standing for QEMU's main loop (an export without `iothread=` runs there):
    /// the one after the command line's objects.
    main_thread: usize,
    /// `--nbd-server` (or `nbd-server-start`).
    pub(crate) nbd_server: Option<NbdServerSpec>,
    /// The `tls-creds-x509` objects by id.
    pub(crate) tls_creds: HashMap<String, NbdTlsSpec>,
    /// The nodes that are inactive (`active=off`, or `blockdev-set-active active=false`).
    inactive: BTreeSet<String>,
}

impl Graph {
    /// Adds a `--blockdev` (or `blockdev-add`) node.
    pub(crate) fn blockdev(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let name = o.required("node-name")?;
        let (node, active) = node::node(&mut o, &self.nodes)?;
        o.finish()?;
        if let Node::Format {
            file_name: Some(file),
            ..
        } = &node
        {
            if active && !self.is_active(file) {
                return Err(QsdError::Invalid {
                    option: "--blockdev".into(),
                    reason: format!("Inactive '{file}' can't be a file child of active '{name}'"),
                });
            }
        }
        if !active {
            self.inactive.insert(name.clone());
        }
        match self.nodes.insert(name.clone(), node) {
            None => Ok(()),
            Some(_) => Err(QsdError::Invalid {
                option: "--blockdev".into(),
                reason: format!("node-name '{name}' is given twice"),
            }),
        }
    }

    /// Adds an `--object` (or `object-add`) of a type in [`object::OBJECT_TYPES`]; returns
    /// what was added (an iothread numbered after the others: its caller starts it).
    pub(crate) fn object(&mut self, mut o: Opts) -> Result<Object, QsdError> {
        let mut object = object::object(&mut o)?;
        let id = object.id().to_string();
        if self.tls_creds.contains_key(&id) || self.objects.iter().any(|t| t.id == id) {
            return Err(o.invalid(format!("id '{id}' is given twice")));
        }
        o.finish()?;
        match &mut object {
            Object::IoThread(t) => {
                t.thread = self.objects.len();
                self.objects.push(t.clone());
            }
            Object::TlsCredsX509(id, creds) => {
                self.tls_creds.insert(id.clone(), creds.clone());
            }
        }
        Ok(object)
    }

    /// Adds an `--export` (or `block-export-add`), its node not yet looked up. An export
    /// without `allow-inactive=on` activates its node, as QEMU's does.
    pub(crate) fn export(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let export = export::export(&mut o)?;
        o.finish()?;
        if !export.allow_inactive && self.nodes.contains_key(&export.node) {
            self.set_active(&export.node, true);
        }
        self.exports.push(export);
        Ok(())
    }

    /// Whether node `name` is active (an unknown name is: it holds nothing).
    pub(crate) fn is_active(&self, name: &str) -> bool {
        !self.inactive.contains(name)
    }

    /// Marks node `name` active or inactive, with its `file` child as QEMU does: activating
    /// a node activates its child first; inactivating it inactivates a child no other active
    /// node stands on. Returns the nodes whose state changed, children first.
    pub(crate) fn set_active(&mut self, name: &str, active: bool) -> Vec<String> {
        let mut changed = Vec::new();
        let child = match self.nodes.get(name) {
            Some(Node::Format { file_name, .. }) => file_name.clone(),
            _ => None,
        };
        if active {
            if let Some(child) = &child {
                changed.extend(self.set_active(child, true));
            }
            if self.inactive.remove(name) {
                changed.push(name.to_string());
            }
        } else {
            if self.inactive.insert(name.to_string()) {
                changed.push(name.to_string());
            }
            if let Some(child) = child {
                let used = self.nodes.iter().any(|(n, node)| {
                    n != name
                        && self.is_active(n)
                        && matches!(node, Node::Format { file_name: Some(f), .. } if *f == child)
                });
                if !used {
                    changed.extend(self.set_active(&child, false));
                }
            }
        }
        changed
    }

    /// The nodes no format node stands on (QEMU's roots: what `blockdev-set-active` without
    /// `node-name` goes through, each with its children).
    pub(crate) fn roots(&self) -> Vec<String> {
        let children: BTreeSet<&String> = self
            .nodes
            .values()
            .filter_map(|n| match n {
                Node::Format { file_name, .. } => file_name.as_ref(),
                _ => None,
            })
            .collect();
        let mut roots: Vec<String> = self
            .nodes
            .keys()
            .filter(|n| !children.contains(n))
            .cloned()
            .collect();
        roots.sort();
        roots
    }

    /// Whether export `e` serves its node inactive: the node is (and the export allows it).
    fn serves_inactive(&self, e: &Export) -> bool {
        e.allow_inactive && !self.is_active(&e.node)
    }

    /// Adds a `--nbd-server` (one only).
    pub(crate) fn nbd_server(&mut self, o: Opts) -> Result<(), QsdError> {
        if self.nbd_server.is_some() {
            return Err(o.invalid("an NBD server is already given"));
        }
        self.nbd_server = Some(self.nbd_server_spec(o)?);
        Ok(())
    }

    /// Reads `nbd-server-start`'s options against the graph's credentials, without keeping
    /// them (the caller keeps them once the server runs).
    pub(crate) fn nbd_server_spec(&self, mut o: Opts) -> Result<NbdServerSpec, QsdError> {
        let spec = nbd_server::server_spec(&mut o, &self.tls_creds)?;
        o.finish()?;
        Ok(spec)
    }

    /// The graph as the daemon's [`Config`]: each vhost-user-blk export one disk on our
    /// iothreads (the `iothread` objects in order, then, if an export names none or a
    /// monitor may add one, one more that stands for QEMU's main loop, polling off as there),
    /// each NBD export one of the NBD server's. `with_monitor`: exports may all come later.
    pub(crate) fn config(&mut self, with_monitor: bool) -> Result<Config, QsdError> {
        self.main_thread = self.objects.len();
        let mut iothread_poll: Vec<PollParams> = self.objects.iter().map(|t| t.poll).collect();
        if self.objects.is_empty()
            || self.exports.iter().any(|e| e.iothread.is_none())
            || with_monitor
        {
            iothread_poll.push(PollParams::default());
        }
        let mut engine: Option<(EngineKind, String)> = None;
        let mut disks = Vec::new();
        let mut nbd_exports = Vec::new();
        for e in &self.exports {
            // Every export's node takes part in the choice, an NBD export's too (it was
            // skipped, and an NBD-only daemon ran the pool whatever its node's `aio=`).
            let aio = if let Transport::Nbd { .. } = e.transport {
                nbd_exports.push(self.nbd_export_spec(e)?);
                self.export_node(e)?.0.image().4
            } else {
                let (disk, aio) = self.disk_spec(e)?;
                disks.push(disk);
                aio
            };
            if let Some((kind, shown)) = aio {
                match &engine {
                    Some((first, at)) if *first != kind => {
                        return Err(QsdError::NotServed {
                            option: shown,
                            what: format!(
                                "a second engine (this daemon runs one for every disk; \
                                 {at} asked for another)"
                            ),
                        })
                    }
                    Some(_) => {}
                    None => engine = Some((kind, shown)),
                }
            }
        }
        // With a monitor, exports may all come later (`block-export-add`), as in QEMU.
        if disks.is_empty() && nbd_exports.is_empty() && !with_monitor {
            return Err(QsdError::Invalid {
                option: "--export".into(),
                reason: "no export and no monitor: nothing to serve".into(),
            });
        }
        if !nbd_exports.is_empty() && self.nbd_server.is_none() {
            return Err(QsdError::Invalid {
                option: "--export type=nbd".into(),
                reason: "NBD server not running (give --nbd-server)".into(),
            });
        }
        // The disks are the vhost-user-blk exports, numbered in order.
        let mut number = 0;
        for e in &mut self.exports {
            if e.transport.kind() == crate::daemon::ExportKind::VhostUserBlk {
                e.disk = Some(number);
                number += 1;
            }
        }
        let mut config = Config::new(disks);
        config.nbd = self.nbd_server.clone();
        config.nbd_exports = nbd_exports;
        // No export asks (they may all come by QMP): the engine the command line's nodes
        // ask for, if they agree on one.
        if engine.is_none() {
            let mut asked = self.nodes.values().filter_map(|n| n.image().4);
            if let Some(first) = asked.next() {
                if asked.all(|(kind, _)| kind == first.0) {
                    engine = Some(first);
                }
            }
        }
        // QEMU's default `aio` is `threads`: our pool.
        config.engine = Choice::Named(engine.map_or(EngineKind::Pool, |(k, _)| k));
        config.iothreads = u16::try_from(iothread_poll.len()).unwrap_or(u16::MAX);
        config.poll_max_ns = PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS);
        config.iothread_poll = iothread_poll;
        Ok(config)
    }

    /// Export `e`'s node, and the number of the iothread it runs on (an export without
    /// `iothread=` runs on the one after the `--object`s, QEMU's main loop).
    pub(crate) fn export_node(&self, e: &Export) -> Result<(&Node, usize), QsdError> {
        let invalid = |reason: String| QsdError::Invalid {
            option: e.shown.clone(),
            reason,
        };
        let node = self
            .nodes
            .get(&e.node)
            .ok_or_else(|| invalid(format!("node-name '{}' names no block node", e.node)))?;
        let iothread = match &e.iothread {
            None => self.main_thread,
            Some(id) => self
                .objects
                .iter()
                .find(|t| &t.id == id)
                .map(|t| t.thread)
                .ok_or_else(|| invalid(format!("iothread '{id}' names no iothread object")))?,
        };
        Ok((node, iothread))
    }

    /// Export `e` as one of our disks: its node's image and format, its iothread, and the
    /// engine its node asks for, with the option that asks.
    pub(crate) fn disk_spec(
        &self,
        e: &Export,
    ) -> Result<(DiskSpec, Option<(EngineKind, String)>), QsdError> {
        let invalid = |reason: String| QsdError::Invalid {
            option: e.shown.clone(),
            reason,
        };
        let (node, iothread) = self.export_node(e)?;
        let (image, format, size, read_only, aio) = node.image();
        if e.writable && read_only {
            return Err(invalid(format!(
                "writable=on, but node '{}' is read-only",
                e.node
            )));
        }
        let Transport::VhostUserBlk { socket, queues } = &e.transport else {
            return Err(invalid("not a vhost-user-blk export".into()));
        };
        let mut disk = DiskSpec::new(socket.clone(), image);
        disk.read_only = !e.writable;
        disk.serial = QEMU_EXPORT_SERIAL.to_string();
        disk.queues = *queues;
        disk.format = format;
        disk.size = size;
        disk.iothread = Some(u16::try_from(iothread).unwrap_or(u16::MAX));
        // qemu-storage-daemon's exports share every permission; ours holds the image as QEMU's
        // own VM disk does (write not shared), so a second writer is refused.
        disk.locking = node.locking();
        disk.id = Some(e.id.clone());
        disk.inactive = self.serves_inactive(e);
        Ok((disk, aio))
    }

    /// NBD export `e` as the daemon's: its node's image and format, its iothread.
    pub(crate) fn nbd_export_spec(&self, e: &Export) -> Result<NbdExportSpec, QsdError> {
        let Transport::Nbd {
            name,
            description,
            allocation_depth,
            bitmaps,
        } = &e.transport
        else {
            return Err(QsdError::Invalid {
                option: e.shown.clone(),
                reason: "not an NBD export".into(),
            });
        };
        let (node, iothread) = self.export_node(e)?;
        let (image, format, size, read_only, _) = node.image();
        if e.writable && read_only {
            return Err(QsdError::Invalid {
                option: e.shown.clone(),
                reason: format!("writable=on, but node '{}' is read-only", e.node),
            });
        }
        let mut spec = NbdExportSpec::new(name.clone(), image);
        spec.description = description.clone();
        spec.format = format;
        spec.size = size;
        spec.writable = e.writable;
        spec.locking = node.locking();
        spec.allocation_depth = *allocation_depth;
        spec.bitmaps = bitmaps.clone();
        spec.writable_node = !read_only;
        spec.id = Some(e.id.clone());
        spec.inactive = self.serves_inactive(e);
        spec.iothread = e
            .iothread
            .as_ref()
            .map(|_| u16::try_from(iothread).unwrap_or(u16::MAX));
        Ok(spec)
    }

    /// Makes every path the graph holds absolute, from the current directory (before
    /// `--daemonize` leaves it for `/`, as qemu-storage-daemon does).
    pub(crate) fn absolute_paths(&mut self) {
        for node in self.nodes.values_mut() {
            node.absolute_paths();
        }
        for e in &mut self.exports {
            match &mut e.transport {
                Transport::VhostUserBlk { socket, .. } => *socket = absolute(socket),
                Transport::Nbd { .. } => {}
            }
        }
        if let Some(n) = self.nbd_server.as_mut() {
            if let aio_nbd::ListenAddr::Unix(p) = &mut n.addr {
                *p = absolute(p);
            }
            if let Some(t) = n.tls.as_mut() {
                t.dir = absolute(&t.dir);
            }
        }
        for t in self.tls_creds.values_mut() {
            t.dir = absolute(&t.dir);
        }
    }
}
