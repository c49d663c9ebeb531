//! qemu-storage-daemon's command line, for the vhost-user-blk and NBD exports it describes:
//! an existing `qemu-storage-daemon --blockdev ... --object iothread,... --export
//! type=vhost-user-blk|nbd,...` runs unchanged with `aio-storage-daemon` in its place.
//!
//! What is served, in QEMU's `key=value` form or its JSON form (`--blockdev '{"driver": ...}'`):
//!
//! - `--blockdev` with drivers `file` and `host_device` (`filename`, `cache.direct`, `aio` =
//!   `threads` | `native` | `io_uring`: our pool, Linux AIO and io_uring engines,
//!   `read-only`, `locking`, `discard`), `raw` and `qcow2` over a protocol node (`file=NODE`,
//!   or inline as `file.driver=...`), `null-co` / `null-aio` (`size`, `read-zeroes`);
//! - `--object iothread,id=,poll-max-ns=,poll-grow=,poll-shrink=`: one of our iothreads each,
//!   with QEMU's polling parameters;
//! - `--export type=vhost-user-blk,id=,node-name=,addr.type=unix,addr.path=,writable=,
//!   num-queues=,iothread=,logical-block-size=512`; an export without `iothread=` runs on an
//!   iothread of its own (QEMU's main loop, which does not busy-poll);
//! - `--chardev socket,id=,path=,server=on,wait=off` with `--monitor chardev=` (QMP on that
//!   socket, [`crate::qmp`]), `--pidfile PATH` and `--daemonize`.
//!
//! The rules:
//!
//! - `--nbd-server` and `--export type=nbd` (`qsd/nbd.rs`): the NBD server and its exports.
//! - Anything else qemu-storage-daemon accepts (a `fuse` export, TLS,
//!   other drivers and objects, an option value we do not serve such as `cache.direct=off` or
//!   `detect-zeroes`) is refused: [`QsdError::NotServed`] names it (exit code 2), nothing is
//!   ignored silently. What is left unsaid takes QEMU's default where we serve it (an export is
//!   read-only unless `writable=on`; `aio` is `threads`), and our own where QEMU's is not
//!   served: images are always opened `O_DIRECT` (QEMU's default is the page cache).
//! - The daemon runs one engine: nodes that ask for different `aio=` are refused by name.
//! - The guest sees what qemu-storage-daemon's export gives it: its serial (`GET_ID`) is
//!   `vhost_user_blk`, as QEMU's.
//!
//! This module owns the translation of that command line into a [`Config`](crate::daemon::Config) (and the
//! process options); it opens nothing. `--disk` is this daemon's own, shorter form; one
//! command line takes one form or the other.

pub(crate) mod command;
pub(crate) mod keyval;
pub(crate) mod nbd;
pub(crate) mod node;

use std::path::PathBuf;

pub use command::QsdCommandLine;

/// What the daemon does not take in a qemu-storage-daemon command line (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QsdError {
    /// An option is malformed or inconsistent: it and what is wrong.
    #[error("{option}: {reason}")]
    Invalid {
        /// The option as given (`--blockdev driver=...`).
        option: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An option asks for something qemu-storage-daemon serves and this daemon does not.
    #[error("{option}: {what} is not served by aio-storage-daemon")]
    NotServed {
        /// The option as given.
        option: String,
        /// What it asks for.
        what: String,
    },
}

impl From<QsdError> for std::io::Error {
    fn from(e: QsdError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// The options that make a command line qemu-storage-daemon's (one is enough).
pub const OPTIONS: &[&str] = &[
    "--blockdev",
    "--export",
    "--object",
    "--chardev",
    "--monitor",
    "--nbd-server",
    "--pidfile",
    "--daemonize",
    "--trace",
];

/// Whether `args` (without the program name) are in qemu-storage-daemon's form.
pub fn is_qsd_command_line(args: &[String]) -> bool {
    args.iter().any(|a| {
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        OPTIONS.contains(&name)
    })
}

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

#[cfg(test)]
mod tests;
