//! How the daemon's process runs: its PID file, `--daemonize`, the monitors' character
//! devices.
//!
//! This module owns [`Process`] and [`Chardev`]; doing what they say is the binary's
//! (`crate::cli`) and the monitor's (`crate::qmp`).

use std::path::PathBuf;

use crate::blockdev::path::absolute;

/// How the process itself runs (the options that are not disks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Process {
    /// `--pidfile PATH`: the daemon's PID written there once it serves, removed at exit.
    pub pidfile: Option<PathBuf>,
    /// `--daemonize`: the daemon detaches once every socket listens; the command returns
    /// then, with 0, or with the error that stopped it before.
    pub daemonize: bool,
    /// `--monitor chardev=ID` over a `--chardev ...,id=ID`: where QMP is served.
    pub monitors: Vec<Chardev>,
}

/// A character device a monitor is served on (QEMU's `--chardev`), the kinds QMP tools use.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Chardev {
    /// `socket,path=PATH,server=on,wait=off`: a unix socket the daemon listens on; any
    /// number of clients connect.
    Listen(PathBuf),
    /// `socket,path=PATH` (`server=off`, QEMU's default): the daemon connects to a socket a
    /// client listens on, once, at start (what qemu-iotests' `QemuStorageDaemon(qmp=True)`
    /// gives it). Refused at start if nobody listens, as QEMU refuses it.
    Connect(PathBuf),
    /// `stdio`: QMP on the daemon's standard input and output (the end of the input ends
    /// that monitor, not the daemon, as in QEMU).
    Stdio,
}

impl Chardev {
    /// The socket's path (none for `stdio`).
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Chardev::Listen(p) | Chardev::Connect(p) => Some(p),
            Chardev::Stdio => None,
        }
    }
}

impl Process {
    /// Makes the PID file's and the monitors' paths absolute.
    pub(crate) fn absolute_paths(&mut self) {
        if let Some(p) = &mut self.pidfile {
            *p = absolute(p);
        }
        for m in &mut self.monitors {
            match m {
                Chardev::Listen(p) | Chardev::Connect(p) => *p = absolute(p),
                Chardev::Stdio => {}
            }
        }
    }
}
