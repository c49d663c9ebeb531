//! Exports (`--export`, `block-export-add`): the export drivers, one row each in
//! [`EXPORT_DRIVERS`], the options every export takes and those only its kind takes.
//!
//! This module owns the exports' options; which node an export serves and on which iothread
//! is the graph's (`super`), serving it the daemon's. A new kind of export is an
//! [`ExportKind`], a [`Transport`] variant, its reader here and one row.

use std::path::PathBuf;

use super::error::QsdError;
use super::keyval::Opts;
use crate::daemon::{ExportKind, NbdBitmapSpec};

/// One `--export`, its node still a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Export {
    pub(crate) id: String,
    pub(crate) node: String,
    pub(crate) writable: bool,
    /// `allow-inactive=on`: the export may serve an inactive node (reads only); off (QEMU's
    /// default), creating the export activates its node.
    pub(crate) allow_inactive: bool,
    pub(crate) iothread: Option<String>,
    /// What only this kind of export takes.
    pub(crate) transport: Transport,
    pub(crate) shown: String,
    /// Its disk's number among the daemon's [`Exports`](crate::daemon::Exports) once a
    /// vhost-user-blk export is served (an NBD export is the NBD server's, by name).
    pub(crate) disk: Option<usize>,
}

/// An export's own options, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transport {
    /// `type=vhost-user-blk`: `addr.type=unix,addr.path=`, `num-queues=`.
    VhostUserBlk { socket: PathBuf, queues: u16 },
    /// `type=nbd`: `name=`, `description=`, `allocation-depth=`, `bitmaps=`.
    Nbd {
        name: String,
        description: Option<String>,
        allocation_depth: bool,
        bitmaps: Vec<NbdBitmapSpec>,
    },
}

/// One export driver: its kind (and so QEMU's `type=` name) and the reader of its own options
/// (given the export's node name, an NBD export's default name).
pub(crate) struct ExportDriver {
    /// The kind ([`ExportKind::qemu_type`] is its `type=`).
    pub(crate) kind: ExportKind,
    read: fn(&mut Opts, &str) -> Result<Transport, QsdError>,
}

/// The export drivers served, one row each.
pub(crate) const EXPORT_DRIVERS: &[ExportDriver] = &[
    ExportDriver {
        kind: ExportKind::VhostUserBlk,
        read: vhost_user_blk,
    },
    ExportDriver {
        kind: ExportKind::Nbd,
        read: nbd,
    },
];

impl Transport {
    /// The kind of export.
    pub(crate) fn kind(&self) -> ExportKind {
        match self {
            Transport::VhostUserBlk { .. } => ExportKind::VhostUserBlk,
            Transport::Nbd { .. } => ExportKind::Nbd,
        }
    }
}

/// Reads an export's options: `type` (a row of [`EXPORT_DRIVERS`]), `id`, `node-name`,
/// `writable`, `allow-inactive`, `iothread`, and what its kind takes.
pub(crate) fn export(o: &mut Opts) -> Result<Export, QsdError> {
    let kind = o.required("type")?;
    let Some(driver) = EXPORT_DRIVERS.iter().find(|d| d.kind.qemu_type() == kind) else {
        return Err(o.not_served(format!("a '{kind}' export")));
    };
    let id = o.required("id")?;
    let node = o.required("node-name")?;
    let writable = o.take_bool("writable", false)?;
    let allow_inactive = o.take_bool("allow-inactive", false)?;
    let iothread = o.take("iothread");
    let transport = (driver.read)(o, &node)?;
    Ok(Export {
        id,
        node,
        writable,
        allow_inactive,
        iothread,
        transport,
        shown: o.shown().to_string(),
        disk: None,
    })
}

/// Reads `type=vhost-user-blk`'s own options.
fn vhost_user_blk(o: &mut Opts, _node: &str) -> Result<Transport, QsdError> {
    match o.required("addr.type")?.as_str() {
        "unix" => {}
        other => return Err(o.not_served(format!("addr.type={other} (unix only)"))),
    }
    let socket = PathBuf::from(o.required("addr.path")?);
    let queues = o.take_u64("num-queues", 1)?;
    let queues = u16::try_from(queues)
        .ok()
        .filter(|q| (1..=256).contains(q))
        .ok_or_else(|| o.invalid(format!("num-queues={queues}: expected 1 to 256")))?;
    match o.take_u64("logical-block-size", 512)? {
        512 => {}
        other => return Err(o.not_served(format!("logical-block-size={other} (512 only)"))),
    }
    Ok(Transport::VhostUserBlk { socket, queues })
}

/// Reads `type=nbd`'s own options; `node` is the export's node, its default name.
fn nbd(o: &mut Opts, node: &str) -> Result<Transport, QsdError> {
    let name = o.take("name").unwrap_or_else(|| node.to_owned());
    if name.len() > aio_nbd::proto::MAX_STRING {
        return Err(o.invalid(format!("export name '{name}' too long")));
    }
    let description = o.take("description");
    let bitmaps = bitmaps(o)?;
    let allocation_depth = o.take_bool("allocation-depth", false)?;
    Ok(Transport::Nbd {
        name,
        description,
        allocation_depth,
        bitmaps,
    })
}

/// Reads `bitmaps` (QEMU's list of `BlockDirtyBitmapOrStr`): `bitmaps.N=NAME`, or
/// `bitmaps.N.node=` with `bitmaps.N.name=` (a JSON list flattens to the same keys), from
/// N = 0 up without a gap.
fn bitmaps(o: &mut Opts) -> Result<Vec<NbdBitmapSpec>, QsdError> {
    if let Some(b) = o.take("bitmaps") {
        return Err(o.invalid(format!(
            "bitmaps={b}: expected a list (bitmaps.0=NAME, or bitmaps.0.node= and bitmaps.0.name=)"
        )));
    }
    let mut out = Vec::new();
    for i in 0.. {
        let key = format!("bitmaps.{i}");
        if let Some(name) = o.take(&key) {
            out.push(NbdBitmapSpec::Local(name));
            continue;
        }
        let Some(mut external) = o.take_child(&key) else {
            break;
        };
        let node = external
            .required("node")
            .map_err(|_| o.invalid(format!("'{key}.node' is missing")))?;
        let name = external
            .required("name")
            .map_err(|_| o.invalid(format!("'{key}.name' is missing")))?;
        if let Err(e) = external.finish() {
            return Err(o.invalid(format!("{key}: {e}")));
        }
        out.push(NbdBitmapSpec::External { node, name });
    }
    Ok(out)
}
