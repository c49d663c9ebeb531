//! qemu-storage-daemon's command line read: `--blockdev`, `--object`, `--export` and
//! `--nbd-server` into the block graph ([`Graph`], the same calls QMP makes), then resolved
//! into the daemon's [`Config`]; `--chardev` and `--monitor` into the monitors' sockets;
//! `--pidfile` and `--daemonize` into the [`Process`].
//!
//! This module owns which options the command line takes and their order; what each block
//! option means is the graph's (`crate::blockdev`), the syntax of one value `keyval`'s.

use std::collections::HashMap;
use std::path::PathBuf;

use super::process::{Chardev, Process};
use crate::blockdev::error::QsdError;
use crate::blockdev::keyval::Opts;
use crate::blockdev::Graph;
use crate::daemon::Config;

/// A qemu-storage-daemon command line, read and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QsdCommandLine {
    /// What the daemon serves, and on what.
    pub config: Config,
    /// How the process runs.
    pub process: Process,
    /// The nodes, objects and exports by their QEMU names (what a monitor answers and
    /// changes).
    pub(crate) graph: Graph,
}

/// The command line as read so far: the graph, the chardevs the monitors name, the process.
#[derive(Default)]
struct Reader {
    graph: Graph,
    /// `--chardev`s by id.
    chardevs: HashMap<String, Chardev>,
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
                // QEMU's implied first keys: `--blockdev file,...` is `driver=file`, `--export
                // nbd,...` is `type=nbd` (qemu-storage-daemon.c's visitors).
                "--blockdev" => {
                    reader
                        .graph
                        .blockdev(Opts::parse(name, &value()?, Some("driver"))?)?
                }
                "--object" => {
                    reader
                        .graph
                        .object(Opts::parse(name, &value()?, Some("qom-type"))?)?;
                }
                "--export" => reader
                    .graph
                    .export(Opts::parse(name, &value()?, Some("type"))?)?,
                "--pidfile" => reader.process.pidfile = Some(PathBuf::from(value()?)),
                "--daemonize" => reader.process.daemonize = true,
                "--chardev" => reader.chardev(Opts::parse(name, &value()?, Some("backend"))?)?,
                "--monitor" => reader.monitor(Opts::parse(name, &value()?, Some("chardev"))?)?,
                "--nbd-server" => reader
                    .graph
                    .nbd_server(Opts::parse(name, &value()?, None)?)?,
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
        let Reader {
            mut graph, process, ..
        } = reader;
        let config = graph.config(!process.monitors.is_empty())?;
        Ok(QsdCommandLine {
            config,
            process,
            graph,
        })
    }
}

fn not_served(option: &str, what: &str) -> QsdError {
    QsdError::NotServed {
        option: option.to_string(),
        what: what.to_string(),
    }
}

impl Reader {
    /// Adds a `--chardev`: `socket,id=,path=` (listening with `server=on,wait=off`,
    /// connecting with `server=off`, QEMU's default) or `stdio,id=`.
    fn chardev(&mut self, mut o: Opts) -> Result<(), QsdError> {
        let backend = o.required("backend")?;
        let id = o.required("id")?;
        let chardev = match backend.as_str() {
            "socket" => {
                let path = PathBuf::from(o.required("path")?);
                if o.take_bool("server", false)? {
                    if o.take_bool("wait", true)? {
                        return Err(
                            o.not_served("wait=on (waiting for a client at start; give wait=off)")
                        );
                    }
                    Chardev::Listen(path)
                } else {
                    if o.take("reconnect").is_some() || o.take("reconnect-ms").is_some() {
                        return Err(o.not_served("reconnect (a client chardev connects once)"));
                    }
                    Chardev::Connect(path)
                }
            }
            "stdio" => {
                // `signal=off` only: a monitor's input is QMP, never a terminal's ^C.
                o.take_bool("signal", false)?;
                o.take_bool("mux", false)?;
                if self.chardevs.values().any(|c| *c == Chardev::Stdio) {
                    return Err(o.invalid("cannot use stdio by multiple character devices"));
                }
                Chardev::Stdio
            }
            other => {
                return Err(o.not_served(format!("a '{other}' chardev (socket and stdio only)")))
            }
        };
        o.finish()?;
        if self.chardevs.insert(id.clone(), chardev).is_some() {
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
        let chardev = self
            .chardevs
            .get(&id)
            .cloned()
            .ok_or_else(|| QsdError::Invalid {
                option: "--monitor".into(),
                reason: format!("chardev '{id}' names no --chardev given before it"),
            })?;
        self.process.monitors.push(chardev);
        Ok(())
    }
}
