//! qemu-storage-daemon's NBD options: `--nbd-server` (and QMP's `nbd-server-start`) and
//! `--export type=nbd` (and `block-export-add`), read into the daemon's NBD types.
//!
//! This module owns those options' meaning; the syntax of a value is `keyval`'s, the graph
//! of nodes and exports `command`'s.
//!
//! * `--nbd-server addr.type=unix,addr.path=` or `addr.type=inet,addr.host=,addr.port=`,
//!   `max-connections=`, `handshake-max-seconds=`. QMP's legacy form (`addr.data.path`) is
//!   read too; `tls-creds=ID` names a `--object tls-creds-x509,id=ID,endpoint=server,dir=,
//!   verify-peer=` given before it (`tls-authz` is refused by name).
//! * `--export type=nbd,id=,node-name=,name=` (default: the node's name), `description=`,
//!   `writable=`, `iothread=`, `allocation-depth=`; `bitmaps` is refused by name.

use std::collections::HashMap;

use aio_nbd::ListenAddr;

use super::command::{Export, Graph, Transport};
use super::keyval::Opts;
use super::QsdError;
use crate::daemon::{NbdExportSpec, NbdServerSpec, NbdTlsSpec};

/// Reads `--nbd-server`'s (or `nbd-server-start`'s) options; `tls-creds=ID` names one of
/// `creds`.
pub(crate) fn server_spec(
    o: &mut Opts,
    creds: &HashMap<String, NbdTlsSpec>,
) -> Result<NbdServerSpec, QsdError> {
    let kind = o.required("addr.type")?;
    // QMP's nbd-server-start takes the legacy address form, its fields under `data`.
    let mut field = |key: &str| {
        o.take(&format!("addr.{key}"))
            .or_else(|| o.take(&format!("addr.data.{key}")))
    };
    let addr = match kind.as_str() {
        "unix" => match field("path") {
            Some(path) => ListenAddr::Unix(path.into()),
            None => return Err(o.invalid("'addr.path' is missing")),
        },
        "inet" => {
            let host = field("host");
            let port = field("port");
            let (Some(host), Some(port)) = (host, port) else {
                return Err(o.invalid("addr.type=inet needs addr.host and addr.port"));
            };
            let port = port
                .parse()
                .map_err(|_| o.invalid(format!("addr.port={port}: expected a port number")))?;
            ListenAddr::Inet { host, port }
        }
        other => return Err(o.not_served(format!("addr.type={other} (unix and inet only)"))),
    };
    if let Some(v) = o.take("tls-authz") {
        return Err(o.not_served(format!(
            "tls-authz={v} (client certificates are checked against the CA only)"
        )));
    }
    let tls = match o.take("tls-creds") {
        None => None,
        Some(id) => Some(
            creds
                .get(&id)
                .cloned()
                .ok_or_else(|| o.invalid(format!("No TLS credentials with id '{id}'")))?,
        ),
    };
    let max = o.take_u64("max-connections", 0)?;
    let max_connections =
        u32::try_from(max).map_err(|_| o.invalid(format!("max-connections={max}: too many")))?;
    let limits = aio_nbd::Limits::default();
    let handshake = o.take_u64("handshake-max-seconds", limits.handshake_timeout.as_secs())?;
    Ok(NbdServerSpec {
        addr,
        max_connections: (max_connections > 0).then_some(max_connections),
        handshake: std::time::Duration::from_secs(handshake),
        tls,
    })
}

/// Reads a `--object tls-creds-x509` (server endpoint): its id and credentials.
pub(crate) fn tls_creds_object(o: &mut Opts) -> Result<(String, NbdTlsSpec), QsdError> {
    let id = o.required("id")?;
    match o.take("endpoint").as_deref() {
        Some("server") => {}
        None => return Err(o.invalid("endpoint=server is missing (QEMU's default is client)")),
        Some(other) => return Err(o.not_served(format!("endpoint={other} (server only)"))),
    }
    let dir = std::path::PathBuf::from(o.required("dir")?);
    let verify_peer = o.take_bool("verify-peer", true)?;
    if let Some(v) = o.take("priority") {
        return Err(o.not_served(format!("priority={v} (rustls's safe defaults are used)")));
    }
    Ok((id, NbdTlsSpec { dir, verify_peer }))
}

impl Transport {
    /// Reads `type=nbd`'s own options; `node` is the export's node, its default name.
    pub(crate) fn nbd(o: &mut Opts, node: &str) -> Result<Transport, QsdError> {
        let name = o.take("name").unwrap_or_else(|| node.to_owned());
        if name.len() > aio_nbd::proto::MAX_STRING {
            return Err(o.invalid(format!("export name '{name}' too long")));
        }
        let description = o.take("description");
        if let Some(b) = o.take("bitmaps").or_else(|| o.take("bitmaps.0")) {
            return Err(o.not_served(format!("bitmaps ({b}): dirty bitmaps are not served")));
        }
        let allocation_depth = o.take_bool("allocation-depth", false)?;
        Ok(Transport::Nbd {
            name,
            description,
            allocation_depth,
        })
    }
}

impl Graph {
    /// Reads a `--nbd-server`.
    pub(crate) fn nbd_server(&mut self, mut o: Opts) -> Result<(), QsdError> {
        if self.nbd_server.is_some() {
            return Err(o.invalid("an NBD server is already given"));
        }
        let spec = server_spec(&mut o, &self.tls_creds)?;
        o.finish()?;
        self.nbd_server = Some(spec);
        Ok(())
    }

    /// NBD export `e` as the daemon's: its node's image and format, its iothread.
    pub(crate) fn nbd_export_spec(&self, e: &Export) -> Result<NbdExportSpec, QsdError> {
        let Transport::Nbd {
            name,
            description,
            allocation_depth,
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
        Ok(NbdExportSpec {
            name: name.clone(),
            description: description.clone(),
            image,
            format,
            size,
            writable: e.writable,
            locking: node.locking(),
            allocation_depth: *allocation_depth,
            iothread: e
                .iothread
                .as_ref()
                .map(|_| u16::try_from(iothread).unwrap_or(u16::MAX)),
        })
    }
}
