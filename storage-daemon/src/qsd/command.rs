//! The command line read into block nodes, iothread objects and exports, then resolved into
//! the daemon's [`Config`]: each export one disk, its node's chain giving the image and its
//! format, its `iothread=` one of ours.
//!
//! This module owns the meaning of qemu-storage-daemon's options; the syntax of one value is
//! `keyval`'s.

use std::collections::HashMap;
use std::path::PathBuf;

use aio::{Choice, EngineKind};
use aio_block::lock::LockMode;
use aio_loop::{PollMaxNs, PollParams};
use aio_virtio_blk::format::ImageFormat;

use super::keyval::Opts;
use super::{Process, QsdError};
use crate::daemon::{Config, DiskSpec, ExportKind};

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
    /// The nodes, iothread objects and exports by their QEMU names (what a monitor answers
    /// and changes).
    pub(crate) graph: Graph,
}

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
        read_only: bool,
    },
    /// `null-co` or `null-aio`.
    Null {
        driver: String,
        size: u64,
        read_only: bool,
    },
}

/// One `--object iothread`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IoThreadObject {
    pub(crate) id: String,
    pub(crate) poll: PollParams,
    /// The number of the daemon's iothread it is (the command line's in order; one a monitor
    /// adds gets the next free number).
    pub(crate) thread: usize,
}

/// One `--export`, its node still a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Export {
    pub(crate) id: String,
    pub(crate) node: String,
    pub(crate) writable: bool,
    pub(crate) iothread: Option<String>,
    /// What only this kind of export takes.
    pub(crate) transport: Transport,
    pub(crate) shown: String,
}

/// An export's own options, by kind: a new kind of export is a variant here, its options'
/// reader in [`Graph::export`], and its disk in [`Graph::disk_spec`]; QMP's commands read the
/// kind's name from [`ExportKind`] and need nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transport {
    /// `type=vhost-user-blk`: `addr.type=unix,addr.path=`, `num-queues=`.
    VhostUserBlk { socket: PathBuf, queues: u16 },
    /// `type=nbd`: `name=`, `description=`, `allocation-depth=` (`qsd/nbd.rs`).
    Nbd {
        name: String,
        description: Option<String>,
        allocation_depth: bool,
    },
}

impl Transport {
    /// The kind of export.
    pub(crate) fn kind(&self) -> ExportKind {
        match self {
            Transport::VhostUserBlk { .. } => ExportKind::VhostUserBlk,
            Transport::Nbd { .. } => ExportKind::Nbd,
        }
    }

    /// Reads `type=vhost-user-blk`'s own options.
    fn vhost_user_blk(o: &mut Opts) -> Result<Transport, QsdError> {
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
}

/// The block nodes, iothread objects and exports read so far, in order (the command line's,
/// then a monitor's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Graph {
    pub(crate) nodes: HashMap<String, Node>,
    pub(crate) objects: Vec<IoThreadObject>,
    pub(crate) exports: Vec<Export>,
    /// The iothread standing for QEMU's main loop (an export without `iothread=` runs there):
    /// the one after the command line's objects.
    main_thread: usize,
    /// `--chardev socket` paths by id.
    chardevs: HashMap<String, PathBuf>,
    process: Process,
    /// `--nbd-server`.
    pub(crate) nbd_server: Option<crate::daemon::NbdServerSpec>,
    /// `--object tls-creds-x509` by id.
    pub(crate) tls_creds: HashMap<String, crate::daemon::NbdTlsSpec>,
}

impl QsdCommandLine {
    /// Reads `args` (without the program name): every option qemu-storage-daemon takes for
    /// what we serve; anything else is refused by name.
    pub fn parse(args: &[String]) -> Result<Self, QsdError> {
        let mut reader = Graph::default();
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
                "--chardev" => reader.chardev(Opts::parse(name, &value()?, Some("backend"))?)?,
                "--monitor" => reader.monitor(Opts::parse(name, &value()?, Some("chardev"))?)?,
                "--nbd-server" => reader.nbd_server(Opts::parse(name, &value()?, None)?)?,
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

impl Graph {
    /// Adds a `--blockdev` (or `blockdev-add`) node.
    pub(crate) fn blockdev(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let name = o.required("node-name")?;
        let node = super::node::node(&mut o, &self.nodes)?;
        o.finish()?;
        match self.nodes.insert(name.clone(), node) {
            None => Ok(()),
            Some(_) => Err(QsdError::Invalid {
                option: "--blockdev".into(),
                reason: format!("node-name '{name}' is given twice"),
            }),
        }
    }

    /// Adds a `--chardev socket,id=,path=,server=on,wait=off` (a listening unix socket).
    fn chardev(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let backend = o.required("backend")?;
        if backend != "socket" {
            return Err(o.not_served(format!("a '{backend}' chardev (socket only)")));
        }
        let id = o.required("id")?;
        let path = PathBuf::from(o.required("path")?);
        if !o.take_bool("server", false)? {
            return Err(o.not_served("a client chardev (server=on only)"));
        }
        if o.take_bool("wait", true)? {
            return Err(o.not_served("wait=on (waiting for a client at start; give wait=off)"));
        }
        o.finish()?;
        if self.chardevs.insert(id.clone(), path).is_some() {
            return Err(QsdError::Invalid {
                option: "--chardev".into(),
                reason: format!("id '{id}' is given twice"),
            });
        }
        Ok(())
    }

    /// Adds a `--monitor chardev=ID[,mode=control]`: QMP on that chardev's socket.
    fn monitor(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let id = o.required("chardev")?;
        match o.take("mode").as_deref() {
            None | Some("control") => {}
            Some(m) => return Err(o.not_served(format!("mode={m} (QMP, mode=control, only)"))),
        }
        o.take_bool("pretty", false)?;
        o.finish()?;
        let path = self
            .chardevs
            .get(&id)
            .cloned()
            .ok_or_else(|| QsdError::Invalid {
                option: "--monitor".into(),
                reason: format!("chardev '{id}' names no --chardev given before it"),
            })?;
        self.process.monitors.push(path);
        Ok(())
    }

    /// Adds an `--object iothread`.
    pub(crate) fn object(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let kind = o.required("qom-type")?;
        if kind == "tls-creds-x509" {
            let (id, creds) = super::nbd::tls_creds_object(&mut o)?;
            if self.tls_creds.contains_key(&id) || self.objects.iter().any(|t| t.id == id) {
                return Err(o.invalid(format!("id '{id}' is given twice")));
            }
            o.finish()?;
            self.tls_creds.insert(id, creds);
            return Ok(());
        }
        if kind != "iothread" {
            return Err(o.not_served(format!("an object of type '{kind}'")));
        }
        let id = o.required("id")?;
        let mut poll = PollParams::iothread();
        poll.max_ns = o.take_u64("poll-max-ns", aio_loop::DEFAULT_POLL_MAX_NS)?;
        poll.grow = o.take_u64("poll-grow", 0)?;
        poll.shrink = o.take_u64("poll-shrink", 0)?;
        if self.objects.iter().any(|t| t.id == id) {
            return Err(o.invalid(format!("id '{id}' is given twice")));
        }
        o.finish()?;
        let thread = self.objects.len();
        self.objects.push(IoThreadObject { id, poll, thread });
        Ok(())
    }

    /// Adds an `--export` (or `block-export-add`), its node not yet looked up.
    pub(crate) fn export(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let kind = o.required("type")?;
        let Some(kind) = ExportKind::from_qemu_type(&kind) else {
            return Err(o.not_served(format!("a '{kind}' export")));
        };
        let id = o.required("id")?;
        let node = o.required("node-name")?;
        let writable = o.take_bool("writable", false)?;
        let iothread = o.take("iothread");
        let transport = match kind {
            ExportKind::VhostUserBlk => Transport::vhost_user_blk(&mut o)?,
            ExportKind::Nbd => Transport::nbd(&mut o, &node)?,
        };
        let shown = o.shown().to_string();
        o.finish()?;
        self.exports.push(Export {
            id,
            node,
            writable,
            iothread,
            transport,
            shown,
        });
        Ok(())
    }

    /// The exports as disks on our iothreads: the `--object iothread`s in order, then, if an
    /// export names none (or a monitor may add one), one more that stands for QEMU's main
    /// loop (polling off, as there).
    fn resolve(mut self) -> Result<QsdCommandLine, QsdError> {
        self.main_thread = self.objects.len();
        let mut iothread_poll: Vec<PollParams> = self.objects.iter().map(|t| t.poll).collect();
        // A monitor may add such an export later.
        if self.objects.is_empty()
            || self.exports.iter().any(|e| e.iothread.is_none())
            || !self.process.monitors.is_empty()
        {
            iothread_poll.push(PollParams::default());
        }
        let mut engine: Option<(EngineKind, String)> = None;
        let mut disks = Vec::new();
        let mut nbd_exports = Vec::new();
        for e in &self.exports {
            if let Transport::Nbd { .. } = e.transport {
                nbd_exports.push(self.nbd_export_spec(e)?);
                continue;
            }
            let (disk, aio) = self.disk_spec(e)?;
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
            disks.push(disk);
        }
        // With a monitor, exports may all come later (`block-export-add`), as in QEMU.
        if disks.is_empty() && nbd_exports.is_empty() && self.process.monitors.is_empty() {
            return Err(QsdError::Invalid {
                option: "--export".into(),
                reason: "no export and no monitor: nothing to serve".into(),
            });
        }
        if !nbd_exports.is_empty() && self.nbd_server.is_none() {
            return Err(QsdError::Invalid {
                option: "--export type=nbd".into(),
                reason: "NBD server not running (give --nbd-server)".into(),
            });
        }
        let mut config = Config::new(disks);
        config.nbd = self.nbd_server.clone();
        config.nbd_exports = nbd_exports;
        // QEMU's default `aio` is `threads`: our pool.
        config.engine = Choice::Named(engine.map_or(EngineKind::Pool, |(k, _)| k));
        config.iothreads = u16::try_from(iothread_poll.len()).unwrap_or(u16::MAX);
        config.poll_max_ns = PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS);
        config.iothread_poll = iothread_poll;
        Ok(QsdCommandLine {
            config,
            process: self.process.clone(),
            graph: self,
        })
    }

    /// Export `e`'s node, and the number of the iothread it runs on (an export without
    /// `iothread=` runs on the one after the `--object`s, QEMU's main loop).
    pub(crate) fn export_node(&self, e: &Export) -> Result<(&Node, usize), QsdError> {
        let invalid = |reason: String| QsdError::Invalid {
            option: e.shown.clone(),
            reason,
        };
        let node = self
            .nodes
            .get(&e.node)
            .ok_or_else(|| invalid(format!("node-name '{}' names no block node", e.node)))?;
        let iothread = match &e.iothread {
            None => self.main_thread,
            Some(id) => self
                .objects
                .iter()
                .find(|t| &t.id == id)
                .map(|t| t.thread)
                .ok_or_else(|| invalid(format!("iothread '{id}' names no iothread object")))?,
        };
        Ok((node, iothread))
    }

    /// Export `e` as one of our disks: its node's image and format, its iothread (an export
    /// without `iothread=` runs on the one after the `--object`s, QEMU's main loop), and the
    /// engine its node asks for, with the option that asks.
    pub(crate) fn disk_spec(
        &self,
        e: &Export,
    ) -> Result<(DiskSpec, Option<(EngineKind, String)>), QsdError> {
        let invalid = |reason: String| QsdError::Invalid {
            option: e.shown.clone(),
            reason,
        };
        let (node, iothread) = self.export_node(e)?;
        let (image, format, size, read_only, aio) = node.image();
        if e.writable && read_only {
            return Err(invalid(format!(
                "writable=on, but node '{}' is read-only",
                e.node
            )));
        }
        let Transport::VhostUserBlk { socket, queues } = &e.transport else {
            return Err(invalid("not a vhost-user-blk export".into()));
        };
        let disk = DiskSpec {
            socket: socket.clone(),
            image,
            read_only: !e.writable,
            serial: QEMU_EXPORT_SERIAL.to_string(),
            queues: *queues,
            format,
            size,
            iothread: Some(u16::try_from(iothread).unwrap_or(u16::MAX)),
            // qemu-storage-daemon's exports share every permission; ours holds the image as
            // QEMU's own VM disk does (write not shared), so a second writer is refused.
            locking: node.locking(),
            share_rw: false,
        };
        Ok((disk, aio))
    }
}

impl Graph {
    /// Makes every path the graph holds absolute, from the current directory (before
    /// `--daemonize` leaves it for `/`, as qemu-storage-daemon does).
    pub(crate) fn absolute_paths(&mut self) {
        for node in self.nodes.values_mut() {
            node.absolute_paths();
        }
        for e in &mut self.exports {
            match &mut e.transport {
                Transport::VhostUserBlk { socket, .. } => *socket = absolute(socket),
                Transport::Nbd { .. } => {}
            }
        }
        for path in self.chardevs.values_mut() {
            *path = absolute(path);
        }
        if let Some(n) = self.nbd_server.as_mut() {
            if let aio_nbd::ListenAddr::Unix(p) = &mut n.addr {
                *p = absolute(p);
            }
            if let Some(t) = n.tls.as_mut() {
                t.dir = absolute(&t.dir);
            }
        }
        for t in self.tls_creds.values_mut() {
            t.dir = absolute(&t.dir);
        }
        self.process.absolute_paths();
    }
}

/// `path` from the current directory (left as it is if that cannot be read).
pub(crate) fn absolute(path: &std::path::Path) -> PathBuf {
    // An RBD image's name (`rbd:pool/image...`) is not a path.
    if crate::daemon::rbd::is_rbd(path) {
        return path.to_path_buf();
    }
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl Process {
    /// Makes the PID file's and the monitors' paths absolute.
    pub(crate) fn absolute_paths(&mut self) {
        if let Some(p) = &mut self.pidfile {
            *p = absolute(p);
        }
        for m in &mut self.monitors {
            *m = absolute(m);
        }
    }
}
