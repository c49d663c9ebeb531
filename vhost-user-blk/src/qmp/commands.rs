//! The QMP commands, with the argument and result names QEMU's schema gives them, over the
//! daemon's block nodes, exports and iothreads.
//!
//! This module owns what each command does and answers; the wire is `wire`'s, the
//! connections `super`'s. The nodes and exports by their QEMU names are the command line's
//! graph ([`Graph`]), which `blockdev-add` and `block-export-add` extend as the command line
//! would; the disks themselves are the daemon's [`Exports`].

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use aio::EngineKind;
use aio_core::{AioContext, EventLoop, IoEngine};
use aio_virtio_blk::format::ImageFormat;
use aio_virtio_blk::stats::StatsSnapshot;

use super::wire::{self, Args, ErrorClass, QmpError, Request};
use crate::daemon::Exports;
use crate::qsd::command::{Graph, Node};
use crate::qsd::keyval::Opts;
use crate::vhost::IoThreads;

/// The commands served, in `query-commands`' order.
pub(crate) const COMMANDS: &[&str] = &[
    "qmp_capabilities",
    "query-version",
    "query-commands",
    "query-iothreads",
    "qom-get",
    "qom-set",
    "query-named-block-nodes",
    "query-block-exports",
    "query-blockstats",
    "block_resize",
    "blockdev-add",
    "blockdev-del",
    "block-export-add",
    "block-export-del",
    "quit",
];

/// What the commands see and change.
pub(crate) struct State {
    pub(crate) graph: Graph,
    /// Each live export's disk number among the daemon's [`Exports`], by export id.
    pub(crate) numbers: HashMap<String, usize>,
    pub(crate) exports: Exports,
    pub(crate) iothreads: IoThreads<Box<dyn EventLoop>, Box<dyn IoEngine>>,
    /// The engine every disk runs on (a new node must not ask for another).
    pub(crate) engine: Option<EngineKind>,
    /// Each iothread's thread id (`query-iothreads`), read once.
    pub(crate) thread_ids: Vec<i64>,
    /// What `quit` says stop to.
    pub(crate) stop: crate::daemon::StopHandle,
}

/// A command's result, and the events it raised.
pub(crate) type Outcome = (Result<Value, QmpError>, Vec<Value>);

fn qsd_error(e: crate::qsd::QsdError) -> QmpError {
    QmpError::generic(e.to_string())
}

impl State {
    /// Runs `request` (after capabilities negotiation).
    pub(crate) fn execute(&mut self, ctx: &AioContext<Box<dyn EventLoop>>, r: Request) -> Outcome {
        let args = Args(r.arguments);
        let mut events = Vec::new();
        let result = match r.execute.as_str() {
            "qmp_capabilities" => Err(QmpError::command_not_found(
                "Capabilities negotiation is already complete, command ignored",
            )),
            "query-version" => args.finish().map(|()| wire::version()),
            "query-commands" => args
                .finish()
                .map(|()| Value::Array(COMMANDS.iter().map(|c| json!({"name": c})).collect())),
            "query-iothreads" => args.finish().map(|()| self.query_iothreads()),
            "qom-get" => self.qom_get(args),
            "qom-set" => self.qom_set(args),
            "query-named-block-nodes" => args.finish().map(|()| self.query_nodes()),
            "query-block-exports" => args.finish().map(|()| self.query_exports()),
            "query-blockstats" => self.query_blockstats(args),
            "block_resize" => self.block_resize(args),
            "blockdev-add" => self.blockdev_add(args),
            "blockdev-del" => self.blockdev_del(args),
            "block-export-add" => self.export_add(ctx, args),
            "block-export-del" => self.export_del(ctx, args, &mut events),
            // As QEMU: the reply, the SHUTDOWN event, then the daemon stops as on SIGTERM.
            "quit" => args.finish().map(|()| {
                let data = json!({"guest": false, "reason": "host-qmp-quit"});
                events.push(wire::event("SHUTDOWN", data));
                self.stop.stop();
                json!({})
            }),
            other => Err(QmpError::command_not_found(format!(
                "The command {other} has not been found"
            ))),
        };
        (result, events)
    }

    fn query_iothreads(&self) -> Value {
        let threads = self.graph.objects.iter().zip(&self.thread_ids);
        Value::Array(
            threads
                .map(|(t, tid)| {
                    json!({
                        "id": t.id,
                        "thread-id": tid,
                        "poll-max-ns": t.poll.max_ns,
                        "poll-grow": t.poll.grow,
                        "poll-shrink": t.poll.shrink,
                        "aio-max-batch": 0,
                    })
                })
                .collect(),
        )
    }

    /// The iothread object at QOM path `/objects/ID`, by index.
    fn object_at(&self, path: &str) -> Result<usize, QmpError> {
        path.strip_prefix("/objects/")
            .and_then(|id| self.graph.objects.iter().position(|t| t.id == id))
            .ok_or_else(|| QmpError {
                class: ErrorClass::DeviceNotFound,
                desc: format!("Device '{path}' not found"),
            })
    }

    fn qom_get(&self, mut args: Args) -> Result<Value, QmpError> {
        let path = args.str("path")?;
        let property = args.str("property")?;
        args.finish()?;
        let poll = self.graph.objects[self.object_at(&path)?].poll;
        match property.as_str() {
            "poll-max-ns" => Ok(json!(poll.max_ns)),
            "poll-grow" => Ok(json!(poll.grow)),
            "poll-shrink" => Ok(json!(poll.shrink)),
            "aio-max-batch" => Ok(json!(0)),
            _ => Err(QmpError::generic(format!(
                "Property 'iothread.{property}' not found"
            ))),
        }
    }

    fn qom_set(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let path = args.str("path")?;
        let property = args.str("property")?;
        let value = args.value("value")?;
        args.finish()?;
        let k = self.object_at(&path)?;
        let number = value
            .as_u64()
            .ok_or_else(|| QmpError::generic(format!("Parameter '{property}' expects uint64")))?;
        let mut poll = self.graph.objects[k].poll;
        match property.as_str() {
            "poll-max-ns" => poll.max_ns = number,
            "poll-grow" => poll.grow = number,
            "poll-shrink" => poll.shrink = number,
            _ => {
                return Err(QmpError::generic(format!(
                    "Property 'iothread.{property}' not found"
                )))
            }
        }
        self.iothreads[k]
            .set_poll_params(poll)
            .map_err(|e| QmpError::generic(e.to_string()))?;
        self.graph.objects[k].poll = poll;
        Ok(json!({}))
    }

    fn query_nodes(&self) -> Value {
        let mut names: Vec<&String> = self.graph.nodes.keys().collect();
        names.sort();
        Value::Array(
            names
                .into_iter()
                .map(|name| node_info(name, &self.graph.nodes[name]))
                .collect(),
        )
    }

    fn query_exports(&self) -> Value {
        let live = self
            .graph
            .exports
            .iter()
            .filter(|e| self.numbers.contains_key(&e.id));
        Value::Array(
            live.map(|e| {
                json!({
                    "type": "vhost-user-blk",
                    "id": e.id,
                    "node-name": e.node,
                    "shutting-down": false,
                })
            })
            .collect(),
        )
    }

    /// Each export's disk (or, with `query-nodes`, each named node: the counts of the export
    /// serving it, zeros for one no export serves), with QEMU's `BlockDeviceStats` fields.
    fn query_blockstats(&self, mut args: Args) -> Result<Value, QmpError> {
        let nodes = args.opt_bool("query-nodes")?.unwrap_or(false);
        args.finish()?;
        let live = || {
            self.graph
                .exports
                .iter()
                .filter_map(|e| Some((e, self.numbers.get(&e.id)?)))
        };
        let entry = |node: &str, stats: StatsSnapshot| json!({"device": "", "node-name": node, "stats": block_device_stats(&stats)});
        if !nodes {
            return Ok(live()
                .map(|(e, &n)| entry(&e.node, self.exports.stats(n).unwrap_or_default()))
                .collect());
        }
        let mut names: Vec<&String> = self.graph.nodes.keys().collect();
        names.sort();
        Ok(names
            .into_iter()
            .map(|name| {
                let stats = live()
                    .find(|(e, _)| &e.node == name)
                    .and_then(|(_, &n)| self.exports.stats(n))
                    .unwrap_or_default();
                entry(name, stats)
            })
            .collect())
    }

    fn blockdev_add(&mut self, args: Args) -> Result<Value, QmpError> {
        let opts = Opts::from_json("blockdev-add", &args.0).map_err(qsd_error)?;
        let mut graph = self.graph.clone();
        graph.blockdev(opts).map_err(qsd_error)?;
        self.graph = graph;
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
        if let Some(e) = self
            .graph
            .exports
            .iter()
            .find(|e| e.node == name && self.numbers.contains_key(&e.id))
        {
            return Err(QmpError::generic(format!(
                "Node '{name}' is busy: block device is in use by block export '{}'",
                e.id
            )));
        }
        let is_child = self.graph.nodes.values().any(|n| match n {
            Node::Format { file, .. } => **file == *node,
            _ => false,
        });
        if is_child {
            return Err(QmpError::generic(format!("Node {name} is in use")));
        }
        self.graph.nodes.remove(&name);
        Ok(json!({}))
    }

    fn export_add(
        &mut self,
        ctx: &AioContext<Box<dyn EventLoop>>,
        args: Args,
    ) -> Result<Value, QmpError> {
        let opts = Opts::from_json("block-export-add", &args.0).map_err(qsd_error)?;
        let mut graph = self.graph.clone();
        graph.export(opts).map_err(qsd_error)?;
        let export = graph.exports.last().expect("just added").clone();
        if self.numbers.contains_key(&export.id) {
            return Err(QmpError::generic(format!(
                "Block export id '{}' is already in use",
                export.id
            )));
        }
        let (spec, aio) = graph.disk_spec(&export).map_err(qsd_error)?;
        if let (Some((kind, _)), Some(running)) = (aio, self.engine) {
            if kind != running {
                return Err(QmpError::generic(format!(
                    "node '{}' asks for the {kind} engine; this daemon runs {running} for \
                     every disk",
                    export.node
                )));
            }
        }
        let number = self
            .exports
            .add(ctx, spec)
            .map_err(|e| QmpError::generic(e.to_string()))?;
        self.numbers.insert(export.id, number);
        self.graph = graph;
        Ok(json!({}))
    }

    fn export_del(
        &mut self,
        ctx: &AioContext<Box<dyn EventLoop>>,
        mut args: Args,
        events: &mut Vec<Value>,
    ) -> Result<Value, QmpError> {
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
        let Some(&number) = self.numbers.get(&id) else {
            return Err(QmpError::generic(format!("Export '{id}' is not found")));
        };
        if !hard && self.exports.connected(number) == Some(true) {
            return Err(QmpError::generic(format!(
                "export '{id}' still in use (a client is connected; mode=hard disconnects it)"
            )));
        }
        self.exports.remove(ctx, number);
        self.numbers.remove(&id);
        self.graph.exports.retain(|e| e.id != id);
        events.push(wire::event("BLOCK_EXPORT_DELETED", json!({"id": id})));
        Ok(json!({}))
    }
}

/// QEMU's `BlockDeviceStats` from `s` (what is not counted here, merges and zoned appends,
/// is 0; invalid requests are counted apart, as QEMU counts them, and leave the idle time).
fn block_device_stats(s: &StatsSnapshot) -> Value {
    let mut out = json!({
        "rd_bytes": s.read.bytes, "wr_bytes": s.write.bytes, "unmap_bytes": s.unmap.bytes,
        "rd_operations": s.read.operations, "wr_operations": s.write.operations,
        "flush_operations": s.flush.operations, "unmap_operations": s.unmap.operations,
        "rd_total_time_ns": s.read.total_time_ns, "wr_total_time_ns": s.write.total_time_ns,
        "flush_total_time_ns": s.flush.total_time_ns,
        "unmap_total_time_ns": s.unmap.total_time_ns,
        "failed_rd_operations": s.read.failed, "failed_wr_operations": s.write.failed,
        "failed_flush_operations": s.flush.failed, "failed_unmap_operations": s.unmap.failed,
        "invalid_rd_operations": s.read.invalid, "invalid_wr_operations": s.write.invalid,
        "invalid_flush_operations": s.flush.invalid,
        "invalid_unmap_operations": s.unmap.invalid,
        "rd_merged": 0, "wr_merged": 0, "unmap_merged": 0,
        "zone_append_bytes": 0, "zone_append_operations": 0, "zone_append_merged": 0,
        "zone_append_total_time_ns": 0, "failed_zone_append_operations": 0,
        "invalid_zone_append_operations": 0,
        "wr_highest_offset": s.wr_highest_offset,
        "account_invalid": false, "account_failed": true,
        "timed_stats": [],
    });
    if let Some(idle) = s.idle_time_ns {
        out["idle_time_ns"] = json!(idle);
    }
    out
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
    })
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
