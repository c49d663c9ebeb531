//! The NBD server's options: `--nbd-server` and QMP's `nbd-server-start` (whose legacy
//! address form, `addr.data.path`, is read too).
//!
//! This module owns those options' meaning: `addr.type=unix,addr.path=` or
//! `addr.type=inet,addr.host=,addr.port=`, `max-connections=`, `handshake-max-seconds=`,
//! `tls-creds=ID` naming a `tls-creds-x509` object given before it (`tls-authz` is refused by
//! name). Running the server is the daemon's.

use std::collections::HashMap;

use aio_nbd::ListenAddr;

use super::error::QsdError;
use super::keyval::Opts;
use crate::daemon::{NbdServerSpec, NbdTlsSpec};

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
