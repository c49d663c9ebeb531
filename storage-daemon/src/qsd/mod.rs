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
//! - `--chardev socket,id=,path=,server=on,wait=off` (a socket the daemon listens on),
//!   `--chardev socket,id=,path=` (one the daemon connects to, `server=off`) or `--chardev
//!   stdio,id=`, with `--monitor chardev=` (QMP there, [`crate::qmp`]); `--pidfile PATH` and
//!   `--daemonize`;
//! - QEMU's implied first keys: `--blockdev file,...` is `driver=file`, `--export nbd,...`
//!   `type=nbd`, `--object iothread,...` `qom-type=iothread`, `--chardev socket,...` the
//!   backend, `--monitor ID` `chardev=ID`.
//!
//! The rules:
//!
//! - `--nbd-server` and `--export type=nbd`: the NBD server and its exports.
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
//! This module owns the command line's options and their order; what the block options mean
//! is the block graph's (the crate's `blockdev/`, shared with QMP); it opens nothing. `--disk`
//! is this daemon's own, shorter form; one command line takes one form or the other.

pub(crate) mod command;
mod process;

pub use crate::blockdev::error::QsdError;
pub use command::QsdCommandLine;
pub use process::{Chardev, Process};

/// The options that make a command line qemu-storage-daemon's (one is enough). `--pidfile`
/// and `--daemonize` are not among them: both forms take those.
pub const OPTIONS: &[&str] = &[
    "--blockdev",
    "--export",
    "--object",
    "--chardev",
    "--monitor",
    "--nbd-server",
    "--trace",
];

/// Whether `args` (without the program name) are in qemu-storage-daemon's form.
pub fn is_qsd_command_line(args: &[String]) -> bool {
    args.iter().any(|a| {
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        OPTIONS.contains(&name)
    })
}

#[cfg(test)]
mod tests;
