//! How the daemon's process runs: its PID file, `--daemonize`, the monitors' sockets.
//!
//! This module owns [`Process`]; doing what it says is the binary's (`crate::cli`).

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
    /// `--monitor chardev=ID` over `--chardev socket,id=ID,path=PATH,server=on,wait=off`: the
    /// sockets QMP is served on.
    pub monitors: Vec<PathBuf>,
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
