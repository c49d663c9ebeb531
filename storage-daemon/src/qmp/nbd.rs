//! QMP's NBD commands: `nbd-server-start`, `nbd-server-stop`, `nbd-server-add` and
//! `nbd-server-remove` (QEMU's deprecated forms of `block-export-add` and `-del`), and `block-export-add` / `block-export-del` of
//! `type=nbd`, with QEMU's errors.
//!
//! This module owns what those commands change (the daemon's NBD server and the graph's NBD
//! exports); the server is the daemon's ([`NbdService`]), the options' meaning the block graph's.
//!
//! * As QEMU: an NBD export needs a running server ("NBD server not running"); stopping the
//!   server ends every NBD export (each announced with `BLOCK_EXPORT_DELETED`).
//! * `block-export-del` (mode `safe`) refuses an export a client still uses; `hard` shuts its
//!   clients down, waits for their requests, then removes it.
//! * An export's dirty bitmaps (`bitmaps`, `nbd-server-add`'s `bitmap`) are found and held
//!   busy by the daemon (`NbdService::add`); a `{node, name}` one is looked up here as the
//!   bitmap commands look theirs up.

use std::rc::Rc;

use serde_json::{json, Map, Value};

use super::commands::{Command, Ctx, State};
use super::wire::{Args, QmpError};
use crate::blockdev::export::{Export, Transport};
use crate::blockdev::keyval::Opts;
use crate::blockdev::Graph;
use crate::daemon::NbdService;

/// The NBD server's commands (its exports are `block-export-add`'s and `-del`'s).
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "nbd-server-start",
        run: |state, ctx, args| state.nbd_server_start(ctx, args),
    },
    Command {
        name: "nbd-server-stop",
        run: |state, ctx, args| state.nbd_server_stop(ctx, args),
    },
    Command {
        name: "nbd-server-add",
        run: |state, ctx, args| state.nbd_server_add(ctx, args),
    },
    Command {
        name: "nbd-server-remove",
        run: |state, ctx, args| state.nbd_server_remove(ctx, args),
    },
];

impl State {
    /// `nbd-server-start`.
    fn nbd_server_start(&mut self, ctx: &Ctx, args: Args) -> Result<Value, QmpError> {
        if self.nbd.borrow().is_some() {
            return Err(QmpError::generic("NBD server already running"));
        }
        let o = Opts::from_json("nbd-server-start", &args.0)?;
        let spec = self.graph.nbd_server_spec(o)?;
        let service = NbdService::start(ctx, &spec, &self.iothreads, &self.events)?;
        *self.nbd.borrow_mut() = Some(Rc::new(service));
        self.graph.nbd_server = Some(spec);
        Ok(json!({}))
    }

    /// `nbd-server-remove name [mode]`: QEMU's deprecated form of `block-export-del` (the
    /// export `nbd-server-add` made has its name as its id), refusing an export of another
    /// type.
    fn nbd_server_remove(&mut self, ctx: &Ctx, mut args: Args) -> Result<Value, QmpError> {
        let name = args.str("name")?;
        let mode = args.opt_str("mode")?;
        args.finish()?;
        let other_type = self
            .graph
            .exports
            .iter()
            .any(|e| e.id == name && !matches!(e.transport, Transport::Nbd { .. }));
        if other_type {
            return Err(QmpError::generic(format!(
                "Block export '{name}' is not an NBD export"
            )));
        }
        let mut del = serde_json::Map::new();
        del.insert("id".into(), json!(name));
        if let Some(mode) = mode {
            del.insert("mode".into(), json!(mode));
        }
        self.export_del(ctx, Args::new(del))
    }

    /// `nbd-server-stop`: every NBD export ends with it.
    fn nbd_server_stop(&mut self, ctx: &Ctx, args: Args) -> Result<Value, QmpError> {
        args.finish()?;
        let Some(service) = self.nbd.borrow_mut().take() else {
            return Err(QmpError::generic("NBD server not running"));
        };
        // Each export's end is announced by the server (BLOCK_EXPORT_DELETED).
        service.stop(ctx);
        let is_nbd = |e: &Export| matches!(e.transport, Transport::Nbd { .. });
        self.graph.exports.retain(|e| !is_nbd(e));
        self.graph.nbd_server = None;
        Ok(json!({}))
    }

    /// `nbd-server-add device [name] [description] [writable] [bitmap]`: as QEMU, the
    /// `block-export-add` of an NBD export whose id is its name (the device's by default),
    /// writable only if the node is, serving `bitmap` if given.
    fn nbd_server_add(&mut self, ctx: &Ctx, mut args: Args) -> Result<Value, QmpError> {
        let device = args.str("device")?;
        let name = args.opt_str("name")?;
        let description = args.opt_str("description")?;
        let writable = args.opt_bool("writable")?;
        let bitmap = args.opt_str("bitmap")?;
        args.finish()?;
        let Some(node) = self.graph.nodes.get(&device) else {
            return Err(QmpError::generic(format!(
                "Cannot find device='{device}' nor node-name='{device}'"
            )));
        };
        // As QEMU: a read-only node is exported read-only, whatever `writable` says.
        let read_only = node.image().3;
        let name = name.unwrap_or_else(|| device.clone());
        let mut export = Map::new();
        export.insert("type".into(), json!("nbd"));
        export.insert("id".into(), json!(name));
        export.insert("node-name".into(), json!(device));
        export.insert("name".into(), json!(name));
        export.insert(
            "writable".into(),
            json!(writable.unwrap_or(false) && !read_only),
        );
        if let Some(d) = description {
            export.insert("description".into(), json!(d));
        }
        if let Some(b) = bitmap {
            export.insert("bitmaps".into(), json!([b]));
        }
        self.export_add(ctx, Args::new(export))
    }

    /// `block-export-add` of `type=nbd`: `graph` is the graph with `export` added.
    pub(super) fn nbd_export_add(
        &mut self,
        graph: Graph,
        export: &Export,
    ) -> Result<Value, QmpError> {
        let spec = graph.nbd_export_spec(export)?;
        let service = self.nbd.borrow().clone();
        let Some(service) = service else {
            return Err(QmpError::generic("NBD server not running"));
        };
        let held = self.served_image(&export.node);
        if !spec.inactive && !spec.is_null() {
            let shared = held.clone().or_else(|| {
                service
                    .image_of(&spec.image)
                    .or_else(|| self.exports.image_of(&spec.image))
            });
            super::active::activated_for_export(shared.as_ref())?;
        }
        let lookup = |node: &str, name: &str| self.find_bitmap(node, name).map_err(|e| e.desc);
        service.add(spec, &self.exports, held, &lookup)?;
        self.graph = graph;
        Ok(json!({}))
    }

    /// `block-export-del` of the NBD export `id`, named `name`.
    pub(super) fn nbd_export_del(
        &mut self,
        id: &str,
        name: &str,
        hard: bool,
    ) -> Result<Value, QmpError> {
        let service = self.nbd.borrow().clone();
        if let Some(service) = service {
            if !hard && service.clients_on(name) > 0 {
                return Err(QmpError::generic(format!(
                    "export '{id}' still in use (a client is connected; mode=hard disconnects it)"
                )));
            }
            // Announced by the server once its clients are gone (BLOCK_EXPORT_DELETED).
            service.remove(name);
        } else {
            self.events.export_deleted(Some(id.to_string()));
        }
        self.graph.exports.retain(|e| e.id != id);
        Ok(json!({}))
    }
}
