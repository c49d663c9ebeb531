//! QMP's NBD commands: `nbd-server-start`, `nbd-server-stop`, and `block-export-add` /
//! `block-export-del` of `type=nbd`, with QEMU's errors.
//!
//! This module owns what those commands change (the daemon's NBD server and the graph's NBD
//! exports); the server is the daemon's ([`NbdService`]), the options' meaning `qsd::nbd`'s.
//!
//! * As QEMU: an NBD export needs a running server ("NBD server not running"); stopping the
//!   server ends every NBD export (each announced with `BLOCK_EXPORT_DELETED`).
//! * `block-export-del` (mode `safe`) refuses an export a client still uses; `hard` shuts its
//!   clients down, waits for their requests, then removes it.

use std::rc::Rc;

use serde_json::{json, Value};

use aio_core::EventLoop;
use aio_loop::AioContext;

use super::commands::State;
use super::wire::{self, Args, QmpError};
use crate::daemon::NbdService;
use crate::qsd::command::{Export, Graph, Transport};
use crate::qsd::keyval::Opts;

fn generic(e: impl std::fmt::Display) -> QmpError {
    QmpError::generic(e.to_string())
}

impl State {
    /// `nbd-server-start`.
    pub(super) fn nbd_server_start(
        &mut self,
        ctx: &AioContext<Box<dyn EventLoop>>,
        args: Args,
    ) -> Result<Value, QmpError> {
        if self.nbd.borrow().is_some() {
            return Err(QmpError::generic("NBD server already running"));
        }
        let mut o = Opts::from_json("nbd-server-start", &args.0).map_err(generic)?;
        let spec = crate::qsd::nbd::server_spec(&mut o, &self.graph.tls_creds).map_err(generic)?;
        o.finish().map_err(generic)?;
        let service = NbdService::start(ctx, &spec, &self.iothreads).map_err(generic)?;
        *self.nbd.borrow_mut() = Some(Rc::new(service));
        self.graph.nbd_server = Some(spec);
        Ok(json!({}))
    }

    /// `object-add qom-type=tls-creds-x509`: credentials a later `nbd-server-start` names.
    pub(super) fn tls_creds_add(&mut self, args: Args) -> Result<Value, QmpError> {
        let opts = Opts::from_json("object-add", &args.0).map_err(generic)?;
        let mut graph = self.graph.clone();
        graph.object(opts).map_err(generic)?;
        self.graph = graph;
        Ok(json!({}))
    }

    /// `nbd-server-stop`: every NBD export ends with it.
    pub(super) fn nbd_server_stop(
        &mut self,
        ctx: &AioContext<Box<dyn EventLoop>>,
        args: Args,
        events: &mut Vec<Value>,
    ) -> Result<Value, QmpError> {
        args.finish()?;
        let Some(service) = self.nbd.borrow_mut().take() else {
            return Err(QmpError::generic("NBD server not running"));
        };
        service.stop(ctx);
        let is_nbd = |e: &Export| matches!(e.transport, Transport::Nbd { .. });
        for e in self.graph.exports.iter().filter(|e| is_nbd(e)) {
            events.push(wire::event("BLOCK_EXPORT_DELETED", json!({"id": e.id})));
        }
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
        let spec = graph.nbd_export_spec(export).map_err(generic)?;
        let service = self.nbd.borrow().clone();
        let Some(service) = service else {
            return Err(QmpError::generic("NBD server not running"));
        };
        service.add(spec, &self.exports).map_err(generic)?;
        self.graph = graph;
        Ok(json!({}))
    }

    /// `block-export-del` of the NBD export `id`, named `name`.
    pub(super) fn nbd_export_del(
        &mut self,
        id: &str,
        name: &str,
        hard: bool,
        events: &mut Vec<Value>,
    ) -> Result<Value, QmpError> {
        let service = self.nbd.borrow().clone();
        if let Some(service) = service {
            if !hard && service.clients_on(name) > 0 {
                return Err(QmpError::generic(format!(
                    "export '{id}' still in use (a client is connected; mode=hard disconnects it)"
                )));
            }
            service.remove(name);
        }
        self.graph.exports.retain(|e| e.id != id);
        events.push(wire::event("BLOCK_EXPORT_DELETED", json!({"id": id})));
        Ok(json!({}))
    }
}
