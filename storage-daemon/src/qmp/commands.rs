//! The QMP commands, with the argument and result names QEMU's schema gives them, over the
//! daemon's block nodes, exports and iothreads.
//!
//! This module owns what each command does and answers; the wire is `wire`'s, the
//! connections `super`'s. The nodes and exports by their QEMU names are the command line's
//! graph ([`Graph`]), which `blockdev-add` and `block-export-add` extend as the command line
//! would; the disks themselves are the daemon's [`Exports`].

use std::path::Path;

use serde_json::{json, Map, Value};

use aio::EngineKind;
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_virtio_blk::format::ImageFormat;

use super::wire::{self, Args, QmpError};
use crate::blockdev::export::Transport;
use crate::blockdev::keyval::Opts;
use crate::blockdev::node::{FormatBacking, Node};
use crate::blockdev::Graph;
use crate::daemon::Exports;
use crate::daemon::IoThreadSet;

/// What the commands see and change.
pub(crate) struct State {
    pub(crate) graph: Graph,
    pub(crate) exports: Exports,
    pub(crate) iothreads: IoThreadSet,
    /// The engine every disk runs on (a new node must not ask for another).
    pub(crate) engine: Option<EngineKind>,
    /// Each iothread's thread id (`query-iothreads`) by number, read once.
    pub(crate) thread_ids: Vec<i64>,
    /// What `quit` says stop to.
    pub(crate) stop: crate::daemon::StopHandle,
    /// The NBD server, when one runs.
    pub(crate) nbd: crate::daemon::NbdSlot,
    /// Where events go (delivered to every client by the monitor).
    pub(crate) events: crate::daemon::EventQueue,
    /// The images the nodes hold ([`crate::daemon::NodeImages`]).
    pub(crate) nodes: crate::daemon::NodeImages,
    /// The jobs (`blockdev-create`'s, listed by `query-jobs`).
    pub(crate) jobs: crate::job::Jobs,
}

/// The control loop the commands run on.
pub(crate) type Ctx = AioContext<Box<dyn EventLoop>>;

/// One QMP command: its name (QEMU's) and what runs it, given its arguments. Each module
/// lists the commands it serves (its `COMMANDS`); `registry` joins the lists, so a name is
/// written once.
pub(crate) struct Command {
    /// QEMU's name of the command.
    pub(crate) name: &'static str,
    /// Runs it (after capabilities negotiation).
    pub(crate) run: fn(&mut State, &Ctx, Args) -> Result<Value, QmpError>,
}

/// The commands of the graph's nodes and exports, the version, and `quit`.
pub(crate) const COMMANDS: &[Command] = &[
    Command {
        name: "query-version",
        run: |_, _, args| args.finish().map(|()| wire::version()),
    },
    Command {
        name: "query-named-block-nodes",
        run: |state, _, args| state.query_nodes(args),
    },
    Command {
        name: "query-block-exports",
        run: |state, _, args| args.finish().map(|()| state.query_exports()),
    },
    Command {
        name: "blockdev-add",
        run: |state, _, args| state.blockdev_add(args),
    },
    Command {
        name: "blockdev-del",
        run: |state, _, args| state.blockdev_del(args),
    },
    Command {
        name: "block-export-add",
        run: |state, ctx, args| state.export_add(ctx, args),
    },
    Command {
        name: "block-export-del",
        run: |state, ctx, args| state.export_del(ctx, args),
    },
    // As qemu-storage-daemon's: the reply, then the daemon stops as on SIGTERM (no SHUTDOWN
    // event: that is the system emulator's; its exports' BLOCK_EXPORT_DELETED go out).
    Command {
        name: "quit",
        run: |state, _, args| {
            args.finish()?;
            state.stop.stop();
            Ok(json!({}))
        },
    },
];

impl State {
    /// `query-named-block-nodes [flat]` (every node is listed as it is: `flat` changes
    /// nothing while no node has a child of its own in the list).
    fn query_nodes(&self, mut args: Args) -> Result<Value, QmpError> {
        args.opt_bool("flat")?;
        args.finish()?;
        Ok(self.nodes_info())
    }

    fn nodes_info(&self) -> Value {
        let mut names: Vec<&String> = self.graph.nodes.keys().collect();
        names.sort();
        Value::Array(
            names
                .into_iter()
                .map(|name| {
                    let mut info = node_info(name, &self.graph.nodes[name]);
                    info["active"] = json!(self.graph.is_active(name));
                    if let Some(bitmaps) = self.dirty_bitmaps_info(name) {
                        info["dirty-bitmaps"] = bitmaps;
                    }
                    info
                })
                .collect(),
        )
    }

    fn query_exports(&self) -> Value {
        Value::Array(
            self.graph
                .exports
                .iter()
                .map(|e| {
                    json!({
                        "type": e.transport.kind().qemu_type(),
                        "id": e.id,
                        "node-name": e.node,
                        "shutting-down": false,
                    })
                })
                .collect(),
        )
    }

    fn blockdev_add(&mut self, args: Args) -> Result<Value, QmpError> {
        let opts = Opts::from_json("blockdev-add", &args.0)?;
        let mut graph = self.graph.clone();
        graph.blockdev(opts)?;
        let added = graph
            .nodes
            .iter()
            .find(|(name, _)| !self.graph.nodes.contains_key(*name))
            .map(|(name, node)| (name.clone(), node.clone()));
        let old = std::mem::replace(&mut self.graph, graph);
        // A qcow2 or null node is opened now, and holds its image (and its locks).
        if let Some((name, node)) = added {
            if let Err(e) = self.hold_added_node(&name, &node) {
                self.graph = old;
                return Err(e);
            }
        }
        Ok(json!({}))
    }

    fn blockdev_del(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let name = args.str("node-name")?;
        args.finish()?;
        let Some(node) = self.graph.nodes.get(&name) else {
            return Err(QmpError::generic(format!(
                "Failed to find node with node-name='{name}'"
            )));
        };
        // QEMU's texts: a node with a user (an export's BlockBackend), then one another node
        // holds (a format node's file).
        if self.graph.exports.iter().any(|e| e.node == name) {
            return Err(QmpError::generic(format!("Node {name} is in use")));
        }
        let is_child = self.graph.nodes.values().any(|n| match n {
            Node::Format { file, backing, .. } => {
                **file == *node || *backing == FormatBacking::Node(name.clone())
            }
            _ => false,
        });
        if is_child {
            return Err(QmpError::generic(format!("Block device {name} is in use")));
        }
        self.graph.nodes.remove(&name);
        // The node's own image closes (no export serves it: checked above).
        if let Some(image) = self.nodes.release(&name) {
            if let Err(e) = image.close() {
                eprintln!("aio-storage-daemon: block node '{name}': closing: {e}");
            }
        }
        Ok(json!({}))
    }

    /// `block-export-add`.
    pub(super) fn export_add(&mut self, ctx: &Ctx, args: Args) -> Result<Value, QmpError> {
        let opts = Opts::from_json("block-export-add", &args.0)?;
        let mut graph = self.graph.clone();
        graph.export(opts)?;
        let Some(export) = graph.exports.last().cloned() else {
            return Err(QmpError::generic("no export was given"));
        };
        if self.graph.exports.iter().any(|e| e.id == export.id) {
            return Err(QmpError::generic(format!(
                "Block export id '{}' is already in use",
                export.id
            )));
        }
        if let Transport::Nbd { .. } = export.transport {
            return self.nbd_export_add(graph, &export);
        }
        let (spec, aio) = graph.disk_spec(&export)?;
        if let (Some((kind, _)), Some(running)) = (aio, self.engine) {
            if kind != running {
                return Err(QmpError::generic(format!(
                    "node '{}' asks for the {kind} engine; this daemon runs {running} for \
                     every disk",
                    export.node
                )));
            }
        }
        // The node's image, or one an NBD export has open, is shared, not opened again.
        let shared = self
            .served_image(&export.node)
            .or_else(|| match self.nbd.borrow().as_ref() {
                Some(n) if !spec.is_null() => n.image_of(&spec.image),
                _ => None,
            });
        if !spec.inactive {
            super::active::activated_for_export(shared.as_ref())?;
        }
        let number = self.exports.add_sharing(ctx, spec, shared)?;
        if let Some(added) = graph.exports.last_mut() {
            added.disk = Some(number);
        }
        self.graph = graph;
        Ok(json!({}))
    }

    pub(super) fn export_del(&mut self, ctx: &Ctx, mut args: Args) -> Result<Value, QmpError> {
        let id = args.str("id")?;
        let hard = match args.opt_str("mode")?.as_deref() {
            None | Some("safe") => false,
            Some("hard") => true,
            Some(other) => {
                return Err(QmpError::generic(format!(
                    "Parameter 'mode' does not accept value '{other}'"
                )))
            }
        };
        args.finish()?;
        let nbd = self.graph.exports.iter().find_map(|e| match &e.transport {
            Transport::Nbd { name, .. } if e.id == id => Some(name.clone()),
            _ => None,
        });
        if let Some(name) = nbd {
            return self.nbd_export_del(&id, &name, hard);
        }
        let disk = self.graph.exports.iter().find(|e| e.id == id);
        let Some(number) = disk.and_then(|e| e.disk) else {
            return Err(QmpError::generic(format!("Export '{id}' is not found")));
        };
        if !hard && self.exports.connected(number) == Some(true) {
            return Err(QmpError::generic(format!(
                "export '{id}' still in use (a client is connected; mode=hard disconnects it)"
            )));
        }
        // The export's end is announced by the daemon's exports (BLOCK_EXPORT_DELETED).
        self.exports.remove(ctx, number);
        self.graph.exports.retain(|e| e.id != id);
        Ok(json!({}))
    }
}

/// `query-named-block-nodes`' entry for `node`: the fields QEMU's `BlockDeviceInfo` has that
/// mean something here.
fn node_info(name: &str, node: &Node) -> Value {
    let (drv, filename, ro) = match node {
        Node::Protocol {
            driver,
            filename,
            read_only,
            ..
        } => (driver.clone(), filename.clone(), *read_only),
        Node::Format {
            format,
            file,
            read_only,
            ..
        } => {
            let filename = match &**file {
                Node::Protocol { filename, .. } => filename.clone(),
                _ => Path::new("").to_path_buf(),
            };
            let format = if *format == ImageFormat::Qcow2 {
                "qcow2"
            } else {
                "raw"
            };
            (format.to_string(), filename, *read_only)
        }
        Node::Null {
            driver, read_only, ..
        } => (driver.clone(), Path::new("").to_path_buf(), *read_only),
    };
    let file = match node {
        Node::Null { driver, .. } => format!("{driver}://"),
        _ => filename.display().to_string(),
    };
    let mut image = Map::new();
    image.insert("filename".into(), json!(file));
    image.insert("format".into(), json!(drv));
    if let Some(size) = virtual_size(node) {
        image.insert("virtual-size".into(), json!(size));
    }
    // What libvirt reads for a disk's allocation (`actual-size`: the file's blocks).
    if let Ok(meta) = std::fs::metadata(&filename) {
        use std::os::unix::fs::MetadataExt;
        image.insert("actual-size".into(), json!(meta.blocks() * 512));
    }
    image.insert("dirty-flag".into(), json!(false));
    if let Some(bits) = qcow2_cluster_bits(node) {
        image.insert("cluster-size".into(), json!(1u64 << bits));
    }
    // QEMU's BlockDeviceInfo has these always: no throttling, no write threshold (yet).
    json!({
        "node-name": name,
        "drv": drv,
        "file": file,
        "ro": ro,
        "encrypted": false,
        "backing_file_depth": 0,
        "detect_zeroes": "off",
        "cache": {"writeback": true, "direct": true, "no-flush": false},
        "image": Value::Object(image),
        "bps": 0, "bps_rd": 0, "bps_wr": 0,
        "iops": 0, "iops_rd": 0, "iops_wr": 0,
        "write_threshold": 0,
    })
}

/// A qcow2 node's cluster bits, from its header (bytes 20..24).
fn qcow2_cluster_bits(node: &Node) -> Option<u32> {
    use std::io::Read;
    let Node::Format {
        format: ImageFormat::Qcow2,
        file,
        ..
    } = node
    else {
        return None;
    };
    let Node::Protocol { filename, .. } = &**file else {
        return None;
    };
    let mut head = [0u8; 24];
    std::fs::File::open(filename)
        .and_then(|mut f| f.read_exact(&mut head))
        .ok()?;
    Some(u32::from_be_bytes(head[20..24].try_into().ok()?)).filter(|b| (9..=21).contains(b))
}

/// The node's disk size: a null node's, a file's or device's length, a qcow2 header's size.
fn virtual_size(node: &Node) -> Option<u64> {
    use std::io::{Read, Seek};
    match node {
        Node::Null { size, .. } => Some(*size),
        Node::Protocol { filename, .. } => std::fs::File::open(filename)
            .and_then(|mut f| f.seek(std::io::SeekFrom::End(0)))
            .ok(),
        Node::Format {
            format: ImageFormat::Qcow2,
            file,
            ..
        } => {
            let Node::Protocol { filename, .. } = &**file else {
                return None;
            };
            let mut head = [0u8; 32];
            std::fs::File::open(filename)
                .and_then(|mut f| f.read_exact(&mut head))
                .ok()?;
            Some(u64::from_be_bytes(head[24..32].try_into().ok()?))
        }
        Node::Format { file, .. } => virtual_size(file),
    }
}
