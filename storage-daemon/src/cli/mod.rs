//! The daemon's command line and signals: `aio-storage-daemon --disk ... [--engine ...]`, or
//! qemu-storage-daemon's own options ([`crate::qsd`]), parsed into a [`Config`], SIGINT and
//! SIGTERM turned into a [`StopHandle::stop`], `--daemonize` and `--pidfile`, and the exit
//! code. Feature `cli` (on by default); the binary is this module's [`main`].
//!
//! This module owns what is process-wide: the arguments and the signal handlers (installed
//! once per process). A program that serves disks itself builds a [`Config`] and calls
//! [`run`](crate::daemon::run()) with its own stop handle.

mod process;

use clap::Parser;

use aio::process::CpuList;
use aio::{Choice, EngineKind, MonitorKind};

use crate::daemon::{
    run_with, Config, DaemonError, DiskSpec, NbdExportSpec, NbdServerSpec, StopHandle,
};
use crate::qsd::{self, QsdCommandLine};

/// `aio-storage-daemon`: serves disk images as vhost-user-blk devices on aio-rs iothreads.
#[derive(Debug, Parser)]
#[command(name = "aio-storage-daemon", version)]
pub struct Args {
    /// A disk: `socket=PATH,image=PATH[,readonly=on][,serial=ID][,queues=Q][,format=auto|raw|qcow2][,iothread=K][,locking=auto|on|off][,share-rw=on]`,
    /// or the null device: `socket=PATH,image=null,size=BYTES[,...]`
    /// (repeatable; each its own socket, and an image given twice only read-only).
    #[arg(
        long = "disk",
        value_name = "SPEC",
        required_unless_present = "nbd_exports"
    )]
    pub disks: Vec<DiskSpec>,
    /// An NBD server: `unix:PATH` or `HOST:PORT`, `[,max-connections=N][,handshake-max-seconds=S]`
    /// `[,tls-creds=DIR[,verify-peer=off]]` (TLS with QEMU's x509 layout: `ca-cert.pem`,
    /// `server-cert.pem`, `server-key.pem`); its clients are served on the iothreads.
    #[arg(long = "nbd", value_name = "ADDR")]
    pub nbd: Option<NbdServerSpec>,
    /// An NBD export: `name=NAME,image=PATH[,writable=on][,description=TEXT][,format=auto|raw|qcow2][,locking=auto|on|off]`,
    /// or `name=NAME,image=null,size=BYTES` (repeatable; an image a `--disk` serves is shared
    /// with it); `,bitmap=NAME` (repeatable) serves the image's dirty bitmap as the context
    /// `qemu:dirty-bitmap:NAME`.
    #[arg(long = "nbd-export", value_name = "SPEC", requires = "nbd")]
    pub nbd_exports: Vec<NbdExportSpec>,
    /// The I/O engine: pool, linux-aio, uring or auto.
    #[arg(long, default_value = "auto")]
    pub engine: Choice<EngineKind>,
    /// The fd monitor: poll, epoll, hybrid, uring or auto.
    #[arg(long, default_value = "auto")]
    pub fdmon: Choice<MonitorKind>,
    /// How many iothreads; the queues of all disks, numbered in order, take them in turn
    /// (queue n on iothread n mod K).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub iothreads: u16,
    /// The iothreads' longest busy-poll window in ns (0: off; default QEMU's IOThread 32768),
    /// or `auto`: the window chosen from the waits each iothread sees.
    #[arg(long, default_value = "32768", value_parser = parse_poll_max_ns)]
    pub poll_max_ns: aio_loop::PollMaxNs,
    /// CPUs to run on, e.g. `0` or `0-1,3`: iothread k on the k-th (mod the count).
    #[arg(long)]
    pub cpus: Option<CpuList>,
    /// Detach once every socket listens, as qemu-storage-daemon's `--daemonize`: the command
    /// returns then, with 0, or with the error that stopped the daemon before.
    #[arg(long)]
    pub daemonize: bool,
    /// Write the daemon's PID to this file once it serves (removed at exit), as
    /// qemu-storage-daemon's `--pidfile`.
    #[arg(long, value_name = "PATH")]
    pub pidfile: Option<std::path::PathBuf>,
}

impl Args {
    /// How the process runs: `--daemonize` and `--pidfile` (this form has no monitor).
    pub fn process(&self) -> qsd::Process {
        qsd::Process {
            daemonize: self.daemonize,
            pidfile: self.pidfile.clone(),
            ..qsd::Process::default()
        }
    }

    /// The configuration these arguments ask for.
    pub fn config(&self) -> Config {
        Config {
            disks: self.disks.clone(),
            engine: self.engine,
            fdmon: self.fdmon,
            iothreads: self.iothreads,
            poll_max_ns: self.poll_max_ns,
            iothread_poll: Vec::new(),
            cpus: self.cpus.clone(),
            nbd: self.nbd.clone(),
            nbd_exports: self.nbd_exports.clone(),
        }
    }
}

/// `--poll-max-ns`: ns or `auto`.
fn parse_poll_max_ns(s: &str) -> Result<aio_loop::PollMaxNs, String> {
    s.parse().map_err(|e: aio_loop::BadPollMaxNs| e.to_string())
}

/// Runs the daemon with command-line arguments (without the program name) until SIGINT or
/// SIGTERM; returns the exit code: 0 after a signal, 2 for bad arguments or disks (the
/// message names them), 1 for a failure. Arguments in qemu-storage-daemon's form
/// ([`qsd::is_qsd_command_line`]) are read as such.
pub fn main(args: Vec<String>) -> i32 {
    if qsd::is_qsd_command_line(&args) {
        return match QsdCommandLine::parse(&args) {
            Ok(line) => serve(line.config, line.process, Some(line.graph)),
            Err(e) => {
                eprintln!("aio-storage-daemon: {e}");
                2
            }
        };
    }
    let args =
        match Args::try_parse_from(std::iter::once("aio-storage-daemon".to_string()).chain(args)) {
            Ok(a) => a,
            Err(e) => {
                let code = if e.use_stderr() { 2 } else { 0 };
                let _ = e.print();
                return code;
            }
        };
    serve(args.config(), args.process(), None)
}

/// Serves `config` as `process` says (QMP over `graph`, the command line's names, on its
/// monitors) until SIGINT or SIGTERM; returns the exit code.
fn serve(
    mut config: Config,
    mut process: qsd::Process,
    mut graph: Option<crate::blockdev::Graph>,
) -> i32 {
    if process.daemonize {
        // The daemon runs in `/` (it keeps no directory busy), so every path given relative
        // to the directory it was started in is resolved first, as qemu-storage-daemon does.
        absolute_paths(&mut config, &mut process, graph.as_mut());
    }
    // Before any thread starts (the signal handler's included): fork is safe only then.
    let detached = match process.daemonize.then(process::daemonize).transpose() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("aio-storage-daemon: --daemonize: {e}");
            return 1;
        }
    };
    if detached.is_some() {
        if let Err(e) = std::env::set_current_dir("/") {
            eprintln!("aio-storage-daemon: --daemonize: changing directory to /: {e}");
            return 1;
        }
    }
    let _pidfile = match process.pidfile.as_deref().map(process::PidFile::create) {
        Some(Err(e)) => {
            eprintln!("aio-storage-daemon: --pidfile {e}");
            return 2;
        }
        Some(Ok(p)) => Some(p),
        None => None,
    };
    let stop = StopHandle::new();
    let on_signal = stop.clone();
    if let Err(e) = ctrlc::set_handler(move || on_signal.stop()) {
        eprintln!("aio-storage-daemon: signal handler: {e}");
        return 1;
    }
    let monitors = process.monitors.clone();
    let graph = graph.unwrap_or_default();
    let engine = config.engine;
    let ready = move |control: &crate::daemon::Control| {
        if !monitors.is_empty() {
            crate::qmp::Monitor::serve(control, &monitors, graph, engine)
                .map_err(|e| std::io::Error::new(e.kind(), format!("the QMP monitor: {e}")))?;
        }
        if let Some(d) = detached {
            d.serving();
        }
        Ok(())
    };
    match run_with(&config, &stop, ready) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("aio-storage-daemon: {e}");
            match e {
                DaemonError::Disk { .. } | DaemonError::Conflict { .. } | DaemonError::Nbd(_) => 2,
                _ => 1,
            }
        }
    }
}

/// Makes every path of the configuration, the process options and the graph absolute.
fn absolute_paths(
    config: &mut Config,
    process: &mut qsd::Process,
    graph: Option<&mut crate::blockdev::Graph>,
) {
    use crate::blockdev::path::absolute;
    for d in &mut config.disks {
        d.socket = absolute(&d.socket);
        if !d.is_null() {
            d.image = absolute(&d.image);
        }
    }
    for e in &mut config.nbd_exports {
        if !e.is_null() {
            e.image = absolute(&e.image);
        }
    }
    if let Some(n) = config.nbd.as_mut() {
        if let aio_nbd::ListenAddr::Unix(p) = &mut n.addr {
            *p = absolute(p);
        }
        if let Some(t) = n.tls.as_mut() {
            t.dir = absolute(&t.dir);
        }
    }
    process.absolute_paths();
    if let Some(g) = graph {
        g.absolute_paths();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_refused_with_their_name() {
        let e = Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--engine", "spdk"])
            .unwrap_err();
        assert!(e.to_string().contains("spdk"), "{e}");
        assert!(Args::try_parse_from(["x"]).is_err());
        let a = Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--iothreads", "2"])
            .unwrap();
        assert_eq!(
            (a.iothreads, a.poll_max_ns, a.engine),
            (2, aio_loop::PollMaxNs::Fixed(32768), Choice::Auto)
        );
        let a =
            Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--poll-max-ns", "auto"])
                .unwrap();
        assert_eq!(a.poll_max_ns, aio_loop::PollMaxNs::Auto);
        let e =
            Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--poll-max-ns", "soon"])
                .unwrap_err();
        assert!(e.to_string().contains("auto"), "{e}");
    }
}
