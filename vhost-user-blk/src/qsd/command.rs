//! The command line read into block nodes, iothread objects and exports, then resolved into
//! the daemon's [`Config`]: each export one disk, its node's chain giving the image and its
//! format, its `iothread=` one of ours.
//!
//! This module owns the meaning of qemu-storage-daemon's options; the syntax of one value is
//! `keyval`'s.

use std::collections::HashMap;
use std::path::PathBuf;

use aio::{Choice, EngineKind};
use aio_core::{PollMaxNs, PollParams};
use aio_virtio_blk::format::ImageFormat;

use super::keyval::Opts;
use super::{Process, QsdError};
use crate::daemon::{Config, DiskSpec};

/// What qemu-storage-daemon's vhost-user-blk export answers to `GET_ID`; ours answers the
/// same, so the guest sees the same disk.
pub const QEMU_EXPORT_SERIAL: &str = "vhost_user_blk";

/// A qemu-storage-daemon command line, read and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QsdCommandLine {
    /// What the daemon serves, and on what.
    pub config: Config,
    /// How the process runs.
    pub process: Process,
}

/// A block node (`--blockdev`, or one given inline as `file.*`).
#[derive(Debug, Clone)]
enum Node {
    /// `file` or `host_device`.
    Protocol {
        filename: PathBuf,
        /// `aio=`, as our engine.
        aio: Option<EngineKind>,
        read_only: bool,
        shown: String,
    },
    /// `raw` or `qcow2` over a protocol node.
    Format {
        format: ImageFormat,
        file: Box<Node>,
        read_only: bool,
    },
    /// `null-co` or `null-aio`.
    Null { size: u64, read_only: bool },
}

/// One `--object iothread`.
#[derive(Debug, Clone)]
struct IoThreadObject {
    id: String,
    poll: PollParams,
}

/// One `--export`, its node still a name.
#[derive(Debug, Clone)]
struct Export {
    node: String,
    socket: PathBuf,
    writable: bool,
    queues: u16,
    iothread: Option<String>,
    shown: String,
}

/// The options read so far, in order.
#[derive(Default)]
struct Reader {
    nodes: HashMap<String, Node>,
    objects: Vec<IoThreadObject>,
    exports: Vec<Export>,
    process: Process,
}

impl QsdCommandLine {
    /// Reads `args` (without the program name): every option qemu-storage-daemon takes for
    /// what we serve; anything else is refused by name.
    pub fn parse(args: &[String]) -> Result<Self, QsdError> {
        let mut reader = Reader::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next().cloned())
                    .ok_or_else(|| QsdError::Invalid {
                        option: name.to_string(),
                        reason: "a value is missing".into(),
                    })
            };
            match name {
                "--blockdev" => reader.blockdev(Opts::parse(name, &value()?, None)?)?,
                "--object" => reader.object(Opts::parse(name, &value()?, Some("qom-type"))?)?,
                "--export" => reader.export(Opts::parse(name, &value()?, None)?)?,
                "--pidfile" => reader.process.pidfile = Some(PathBuf::from(value()?)),
                "--daemonize" => reader.process.daemonize = true,
                "--chardev" | "--monitor" => {
                    return Err(not_served(arg, "the QMP monitor (--chardev, --monitor)"))
                }
                "--nbd-server" => return Err(not_served(arg, "an NBD server")),
                "--trace" => return Err(not_served(arg, "QEMU's tracing")),
                "--disk" | "--engine" | "--fdmon" | "--iothreads" | "--poll-max-ns" | "--cpus" => {
                    return Err(QsdError::Invalid {
                        option: arg.clone(),
                        reason: "this daemon's own option: one command line takes \
                                 qemu-storage-daemon's options or --disk, not both"
                            .into(),
                    })
                }
                _ => return Err(not_served(arg, &format!("the option '{name}'"))),
            }
        }
        reader.resolve()
    }
}

fn not_served(option: &str, what: &str) -> QsdError {
    QsdError::NotServed {
        option: option.to_string(),
        what: what.to_string(),
    }
}

impl Reader {
    fn blockdev(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let name = o.required("node-name")?;
        let node = node(&mut o, &self.nodes)?;
        o.finish()?;
        match self.nodes.insert(name.clone(), node) {
            None => Ok(()),
            Some(_) => Err(QsdError::Invalid {
                option: "--blockdev".into(),
                reason: format!("node-name '{name}' is given twice"),
            }),
        }
    }

    fn object(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let kind = o.required("qom-type")?;
        if kind != "iothread" {
            return Err(o.not_served(format!("an object of type '{kind}'")));
        }
        let id = o.required("id")?;
        let mut poll = PollParams::iothread();
        poll.max_ns = o.take_u64("poll-max-ns", aio_core::DEFAULT_POLL_MAX_NS)?;
        poll.grow = o.take_u64("poll-grow", 0)?;
        poll.shrink = o.take_u64("poll-shrink", 0)?;
        if self.objects.iter().any(|t| t.id == id) {
            return Err(o.invalid(format!("id '{id}' is given twice")));
        }
        o.finish()?;
        self.objects.push(IoThreadObject { id, poll });
        Ok(())
    }

    fn export(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let kind = o.required("type")?;
        if kind != "vhost-user-blk" {
            return Err(o.not_served(format!("a '{kind}' export")));
        }
        let _id = o.required("id")?;
        let node = o.required("node-name")?;
        match o.required("addr.type")?.as_str() {
            "unix" => {}
            other => return Err(o.not_served(format!("addr.type={other} (unix only)"))),
        }
        let socket = PathBuf::from(o.required("addr.path")?);
        let writable = o.take_bool("writable", false)?;
        let queues = o.take_u64("num-queues", 1)?;
        let queues = u16::try_from(queues)
            .ok()
            .filter(|q| (1..=256).contains(q))
            .ok_or_else(|| o.invalid(format!("num-queues={queues}: expected 1 to 256")))?;
        let iothread = o.take("iothread");
        match o.take_u64("logical-block-size", 512)? {
            512 => {}
            other => return Err(o.not_served(format!("logical-block-size={other} (512 only)"))),
        }
        let shown = o.shown().to_string();
        o.finish()?;
        self.exports.push(Export {
            node,
            socket,
            writable,
            queues,
            iothread,
            shown,
        });
        Ok(())
    }

    /// The exports as disks on our iothreads: the `--object iothread`s in order, then, if an
    /// export names none, one more that stands for QEMU's main loop (polling off, as there).
    fn resolve(self) -> Result<QsdCommandLine, QsdError> {
        let mut iothread_poll: Vec<PollParams> = self.objects.iter().map(|t| t.poll).collect();
        let main_loop = iothread_poll.len();
        if self.objects.is_empty() || self.exports.iter().any(|e| e.iothread.is_none()) {
            iothread_poll.push(PollParams::default());
        }
        let mut engine: Option<(EngineKind, String)> = None;
        let mut disks = Vec::new();
        for e in &self.exports {
            let invalid = |reason: String| QsdError::Invalid {
                option: e.shown.clone(),
                reason,
            };
            let node = self
                .nodes
                .get(&e.node)
                .ok_or_else(|| invalid(format!("node-name '{}' names no --blockdev", e.node)))?;
            let iothread = match &e.iothread {
                None => main_loop,
                Some(id) => self
                    .objects
                    .iter()
                    .position(|t| &t.id == id)
                    .ok_or_else(|| invalid(format!("iothread '{id}' names no --object")))?,
            };
            let (image, format, size, read_only, aio) = node.image();
            if e.writable && read_only {
                return Err(invalid(format!(
                    "writable=on, but node '{}' is read-only",
                    e.node
                )));
            }
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
            disks.push(DiskSpec {
                socket: e.socket.clone(),
                image,
                read_only: !e.writable,
                serial: QEMU_EXPORT_SERIAL.to_string(),
                queues: e.queues,
                format,
                size,
                iothread: Some(u16::try_from(iothread).unwrap_or(u16::MAX)),
            });
        }
        if disks.is_empty() {
            return Err(QsdError::Invalid {
                option: "--export".into(),
                reason: "no export: nothing to serve".into(),
            });
        }
        let mut config = Config::new(disks);
        // QEMU's default `aio` is `threads`: our pool.
        config.engine = Choice::Named(engine.map_or(EngineKind::Pool, |(k, _)| k));
        config.iothreads = u16::try_from(iothread_poll.len()).unwrap_or(u16::MAX);
        config.poll_max_ns = PollMaxNs::Fixed(aio_core::DEFAULT_POLL_MAX_NS);
        config.iothread_poll = iothread_poll;
        Ok(QsdCommandLine {
            config,
            process: self.process,
        })
    }
}

/// Reads one node's options (its `driver` and what that driver takes); an inline child
/// (`file.*`) is read the same way, and `file=NODE` names a node given before, as QEMU
/// requires.
fn node(o: &mut Opts, nodes: &HashMap<String, Node>) -> Result<Node, QsdError> {
    let driver = o.required("driver")?;
    let read_only = o.take_bool("read-only", false)?;
    match driver.as_str() {
        "file" | "host_device" => {
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
                Some(other) => {
                    return Err(o.invalid(format!("aio={other}: threads, native or io_uring")))
                }
            };
            match o.take("locking").as_deref() {
                None | Some("off" | "auto") => {}
                Some(v) => return Err(o.not_served(format!("locking={v} (image locks)"))),
            }
            match o.take("discard").as_deref() {
                None | Some("unmap" | "on") => {}
                Some(v) => return Err(o.not_served(format!("discard={v} (discards are passed)"))),
            }
            Ok(Node::Protocol {
                filename,
                aio,
                read_only,
                shown: o.shown().to_string(),
            })
        }
        "raw" | "qcow2" => {
            let format = if driver == "raw" {
                ImageFormat::Raw
            } else {
                ImageFormat::Qcow2
            };
            let file = match (o.take("file"), o.take_child("file")) {
                (Some(_), Some(_)) => return Err(o.invalid("both file= and file.* are given")),
                (None, None) => return Err(o.invalid("'file' is missing")),
                (Some(name), None) => nodes.get(&name).cloned().ok_or_else(|| {
                    o.invalid(format!("file={name} names no --blockdev given before it"))
                })?,
                (None, Some(mut child)) => {
                    let child_node = node(&mut child, nodes)?;
                    child.finish()?;
                    child_node
                }
            };
            if !matches!(file, Node::Protocol { .. }) {
                return Err(o.not_served("a format node over another format or null node"));
            }
            Ok(Node::Format {
                format,
                file: Box::new(file),
                read_only,
            })
        }
        "null-co" | "null-aio" => {
            let text = o.required("size")?;
            let size = crate::daemon::parse_size(&text)
                .ok_or_else(|| o.invalid(format!("size={text}: expected a number of bytes")))?;
            // Zeros are what `read-zeroes=on` asks for, and one of the contents `off` allows.
            o.take_bool("read-zeroes", false)?;
            Ok(Node::Null { size, read_only })
        }
        other => Err(o.not_served(format!("the driver '{other}'"))),
    }
}

impl Node {
    /// The image file (or `null`), its format, the null device's size, whether the node or
    /// the file under it is read-only, and the engine it asks for (with the option that asks).
    fn image(
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
            } => {
                let (path, _, _, file_ro, aio) = file.image();
                (path, *format, None, *read_only || file_ro, aio)
            }
            Node::Null { size, read_only } => (
                PathBuf::from("null"),
                ImageFormat::Raw,
                Some(*size),
                *read_only,
                None,
            ),
        }
    }
}
