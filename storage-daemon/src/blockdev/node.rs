//! Block nodes (`--blockdev`, `blockdev-add`, or one given inline as `file.*`): the node
//! drivers, one row each in [`NODE_DRIVERS`], their options read, and what the daemon takes
//! from a node (the image, its format, locking, the engine it asks for).
//!
//! This module owns the drivers' options; the graph of nodes and exports is `super`'s.
//! A new node driver is one reader function here and one row in [`NODE_DRIVERS`].

use std::collections::HashMap;
use std::path::PathBuf;

use aio::EngineKind;
use aio_block::lock::LockMode;
use aio_virtio_blk::format::ImageFormat;

use super::error::QsdError;
use super::keyval::Opts;
use super::path::absolute;

/// A block node (`--blockdev`, or one given inline as `file.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// `file` or `host_device`.
    Protocol {
        /// `file` or `host_device`.
        driver: String,
        filename: PathBuf,
        /// `aio=`, as our engine.
        aio: Option<EngineKind>,
        read_only: bool,
        /// `locking=auto|on|off`.
        locking: LockMode,
        shown: String,
    },
    /// `raw` or `qcow2` over a protocol node.
    Format {
        format: ImageFormat,
        file: Box<Node>,
        /// The name of the node `file=` names (none for an inline `file.*` child).
        file_name: Option<String>,
        read_only: bool,
        /// Where a qcow2 node's unallocated clusters come from.
        backing: FormatBacking,
    },
    /// `null-co` or `null-aio`.
    Null {
        driver: String,
        size: u64,
        read_only: bool,
    },
}

/// Where a qcow2 node's unallocated clusters come from (QEMU's `backing`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum FormatBacking {
    /// The backing file its header names (`backing` not given).
    #[default]
    File,
    /// None: they read zeros (`backing=null`).
    None,
    /// The node of that name, read through (`backing=NODE`).
    Node(String),
}

/// Reads a driver's own options: the options (its `driver` and `read-only` taken), the
/// driver's name, `read-only`, and the nodes given before (for `file=NODE`).
type ReadNode = fn(&mut Opts, String, bool, &HashMap<String, Node>) -> Result<Node, QsdError>;

/// One node driver: QEMU's name and its reader.
pub(crate) struct NodeDriver {
    /// QEMU's name (`--blockdev driver=NAME`).
    pub(crate) name: &'static str,
    read: ReadNode,
}

/// The node drivers served, one row each (QEMU's `BlockdevDriver` names).
pub(crate) const NODE_DRIVERS: &[NodeDriver] = &[
    NodeDriver {
        name: "file",
        read: protocol_node,
    },
    NodeDriver {
        name: "host_device",
        read: protocol_node,
    },
    NodeDriver {
        name: "rbd",
        read: rbd_node,
    },
    NodeDriver {
        name: "raw",
        read: format_node,
    },
    NodeDriver {
        name: "qcow2",
        read: format_node,
    },
    NodeDriver {
        name: "null-co",
        read: null_node,
    },
    NodeDriver {
        name: "null-aio",
        read: null_node,
    },
];

/// Reads one node's options (its `driver`, `read-only`, `active` and what that driver takes);
/// an inline child (`file.*`) is read the same way, and `file=NODE` names a node given
/// before, as QEMU requires. Returns the node and whether it is active (QEMU's `active`,
/// default on: off opens it inactive, for an incoming migration).
pub(crate) fn node(o: &mut Opts, nodes: &HashMap<String, Node>) -> Result<(Node, bool), QsdError> {
    let driver = o.required("driver")?;
    let read_only = o.take_bool("read-only", false)?;
    let active = o.take_bool("active", true)?;
    match NODE_DRIVERS.iter().find(|d| d.name == driver) {
        Some(d) => Ok(((d.read)(o, driver, read_only, nodes)?, active)),
        None => Err(o.not_served(format!("the driver '{driver}'"))),
    }
}

/// Reads a `raw` or `qcow2` node over a protocol node (`file=NODE` or inline `file.*`).
fn format_node(
    o: &mut Opts,
    driver: String,
    read_only: bool,
    nodes: &HashMap<String, Node>,
) -> Result<Node, QsdError> {
    let format = if driver == "raw" {
        ImageFormat::Raw
    } else {
        ImageFormat::Qcow2
    };
    let (file, file_name) = match (o.take("file"), o.take_child("file")) {
        (Some(_), Some(_)) => return Err(o.invalid("both file= and file.* are given")),
        (None, None) => return Err(o.invalid("'file' is missing")),
        (Some(name), None) => {
            let node = nodes.get(&name).cloned().ok_or_else(|| {
                o.invalid(format!("file={name} names no --blockdev given before it"))
            })?;
            (node, Some(name))
        }
        (None, Some(mut child)) => {
            let (child_node, _active) = node(&mut child, nodes)?;
            child.finish()?;
            (child_node, None)
        }
    };
    if !matches!(file, Node::Protocol { .. }) {
        return Err(o.not_served("a format node over another format or null node"));
    }
    let backing = match (format, o.take("backing")) {
        (_, None) => FormatBacking::File,
        (ImageFormat::Raw, Some(_)) => {
            return Err(o.invalid("Invalid parameter 'backing'"));
        }
        (_, Some(name)) if name == "null" => FormatBacking::None,
        (_, Some(name)) => {
            if !nodes.contains_key(&name) {
                return Err(o.invalid(format!("Cannot find device='' nor node-name='{name}'")));
            }
            FormatBacking::Node(name)
        }
    };
    Ok(Node::Format {
        format,
        file: Box::new(file),
        file_name,
        read_only,
        backing,
    })
}

/// Reads a `null-co` or `null-aio` node.
fn null_node(
    o: &mut Opts,
    driver: String,
    read_only: bool,
    _: &HashMap<String, Node>,
) -> Result<Node, QsdError> {
    // QEMU's null driver is 1 GiB unless told otherwise.
    let text = o.take("size").unwrap_or_else(|| (1u64 << 30).to_string());
    let size = crate::daemon::parse_size(&text)
        .ok_or_else(|| o.invalid(format!("size={text}: expected a number of bytes")))?;
    // Zeros are what `read-zeroes=on` asks for, and one of the contents `off` allows.
    o.take_bool("read-zeroes", false)?;
    Ok(Node::Null {
        driver,
        size,
        read_only,
    })
}

/// Reads a `file` or `host_device` node's own options.
fn protocol_node(
    o: &mut Opts,
    driver: String,
    read_only: bool,
    _: &HashMap<String, Node>,
) -> Result<Node, QsdError> {
    let filename = PathBuf::from(o.required("filename")?);
    if let Some(v) = o.take("cache.direct") {
        if v != "on" && v != "true" {
            return Err(o.not_served(format!(
                "cache.direct={v} (the page cache: images are always opened O_DIRECT)"
            )));
        }
    }
    let aio = match o.take("aio").as_deref() {
        None => None,
        Some("threads") => Some(EngineKind::Pool),
        Some("native") => Some(EngineKind::LinuxAio),
        Some("io_uring") => Some(EngineKind::Uring),
        Some(other) => return Err(o.invalid(format!("aio={other}: threads, native or io_uring"))),
    };
    let locking = match o.take("locking") {
        None => LockMode::Auto,
        Some(v) => v.parse().map_err(|e| o.invalid(format!("{e}")))?,
    };
    take_discard(o)?;
    Ok(Node::Protocol {
        driver,
        filename,
        aio,
        read_only,
        locking,
        shown: o.shown().to_string(),
    })
}

/// `discard=`: only `unmap` (or `on`) is served, since discards are always passed.
fn take_discard(o: &mut Opts) -> Result<(), QsdError> {
    match o.take("discard").as_deref() {
        None | Some("unmap" | "on") => Ok(()),
        Some(v) => Err(o.not_served(format!("discard={v} (discards are passed)"))),
    }
}

/// `\\` and `:` escaped, for a value inside QEMU's `rbd:` filename.
fn escaped(value: &str) -> String {
    value.replace('\\', "\\\\").replace(':', "\\:")
}

/// Reads an `rbd` node (QEMU's `BlockdevOptionsRbd`): the image as QEMU's `rbd:` filename,
/// which the daemon opens as it opens `--disk image=rbd:...`.
fn rbd_node(
    o: &mut Opts,
    driver: String,
    read_only: bool,
    _: &HashMap<String, Node>,
) -> Result<Node, QsdError> {
    let (pool, image) = (o.required("pool")?, o.required("image")?);
    let mut name = format!("rbd:{}/", escaped(&pool));
    if let Some(ns) = o.take("namespace") {
        name += &format!("{}/", escaped(&ns));
    }
    name += &escaped(&image);
    if let Some(snap) = o.take("snapshot") {
        name += &format!("@{}", escaped(&snap));
    }
    if let Some(conf) = o.take("conf") {
        name += &format!(":conf={}", escaped(&conf));
    }
    if let Some(user) = o.take("user") {
        name += &format!(":id={}", escaped(&user));
    }
    // `server.N.host` / `.port`: the monitors, instead of the configuration's.
    let mut monitors = Vec::new();
    while let Some(host) = o.take(&format!("server.{}.host", monitors.len())) {
        let port = o.take(&format!("server.{}.port", monitors.len()));
        monitors.push(match port {
            Some(port) => format!("{host}:{port}"),
            None => host,
        });
    }
    if !monitors.is_empty() {
        name += &format!(":mon_host={}", escaped(&monitors.join(",")));
    }
    // QEMU's rbd driver turns librbd's cache off for `cache.direct=on` (`cache=none`) and on
    // otherwise, which is librbd's own default.
    match o.take("cache.direct").as_deref() {
        None | Some("off" | "false" | "no") => {}
        Some("on" | "true" | "yes") => name += ":rbd_cache=false",
        Some(v) => return Err(o.invalid(format!("cache.direct={v}: expected on or off"))),
    }
    take_discard(o)?;
    for unserved in ["encrypt", "key-secret", "auth-client-required"] {
        if o.take(unserved).is_some() {
            return Err(o.not_served(format!(
                "{unserved}= (give the key in the configuration or keyring)"
            )));
        }
    }
    Ok(Node::Protocol {
        driver,
        filename: PathBuf::from(name),
        aio: None,
        read_only,
        locking: LockMode::Auto,
        shown: o.shown().to_string(),
    })
}

impl Node {
    pub(crate) fn absolute_paths(&mut self) {
        match self {
            Node::Protocol { filename, .. } => *filename = absolute(filename),
            Node::Format { file, .. } => file.absolute_paths(),
            Node::Null { .. } => {}
        }
    }

    /// The `locking=` of the file under the node (`off` for the null device: no file).
    pub(crate) fn locking(&self) -> LockMode {
        match self {
            Node::Protocol { locking, .. } => *locking,
            Node::Format { file, .. } => file.locking(),
            Node::Null { .. } => LockMode::Off,
        }
    }

    /// The image file (or `null`), its format, the null device's size, whether the node or
    /// the file under it is read-only, and the engine it asks for (with the option that asks).
    pub(crate) fn image(
        &self,
    ) -> (
        PathBuf,
        ImageFormat,
        Option<u64>,
        bool,
        Option<(EngineKind, String)>,
    ) {
        match self {
            Node::Protocol {
                filename,
                aio,
                read_only,
                shown,
                ..
            } => (
                filename.clone(),
                ImageFormat::Raw,
                None,
                *read_only,
                aio.map(|k| (k, shown.clone())),
            ),
            Node::Format {
                format,
                file,
                read_only,
                ..
            } => {
                let (path, _, _, file_ro, aio) = file.image();
                (path, *format, None, *read_only || file_ro, aio)
            }
            Node::Null {
                size, read_only, ..
            } => (
                PathBuf::from("null"),
                ImageFormat::Raw,
                Some(*size),
                *read_only,
                None,
            ),
        }
    }
}
