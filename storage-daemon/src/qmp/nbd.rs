//! QMP's NBD commands: `nbd-server-start`, `nbd-server-stop`, and `block-export-add` /
//! `block-export-del` of `type=nbd`, with QEMU's errors.
//!
//! This module owns what those commands change (the daemon's NBD server and the graph's NBD
//! exports); the server is the daemon's ([`NbdService`]), the options' meaning the block graph's.
//!
//! * As QEMU: an NBD export needs a running server ("NBD server not running"); stopping the
//!   server ends every NBD export (each announced with `BLOCK_EXPORT_DELETED`).
//! * `block-export-del` (mode `safe`) refuses an export a client still uses; `hard` shuts its
//!   clients down, waits for their requests, then removes it.

use std::rc::Rc;

use serde_json::{json, Value};

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
        service.add(spec, &self.exports, held)?;
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
