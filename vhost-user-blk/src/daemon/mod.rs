//! The daemon: `--disk` images served as vhost-user-blk devices on aio-rs iothreads.
//!
//! This module owns the daemon's life: open the images, start the iothreads (each an
//! [`aio_core::IoThread`] with its own engine and fd monitor, busy polling at
//! `--poll-max-ns`), serve every socket on a control loop on the main thread, and end cleanly
//! on SIGINT or SIGTERM (every connection drained, sockets removed, exit 0).
//!
//! Threads: the main thread's `AioContext` holds the listening sockets and the connections
//! (vhost-user messages); each iothread's `AioContext` holds its queues' kick fds and its
//! engine's completions. Queue `i` of every disk runs on iothread `i mod K`.

mod args;
pub mod backends;
mod distinct;
mod socket;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aio_core::engine::IoEngine;
use aio_core::{AioContext, EventLoop, IoThread};
use clap::Parser;

pub use args::{Args, CpuList, DiskSpec};
pub use socket::DiskSocket;

use crate::dataplane::DataPlane;
use crate::device::{BlockDevice, DiskOptions};

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// A disk could not be opened or served (exit code 2: it names the argument).
    #[error("--disk {spec}: {reason}")]
    Disk {
        /// The disk's socket path.
        spec: String,
        /// Why.
        reason: String,
    },
    /// Two `--disk` arguments collide: one socket, or one image with a writer (exit code 2:
    /// it names both).
    #[error("--disk {first} and --disk {second}: {reason}")]
    Conflict {
        /// The earlier `--disk`.
        first: String,
        /// The later one.
        second: String,
        /// How they collide.
        reason: String,
    },
    /// The backends or the iothreads could not start.
    #[error("{0}")]
    Start(String),
    /// Signal handling could not be set up.
    #[error("signal handler: {0}")]
    Signals(String),
}

/// Runs the daemon with command-line arguments (without the program name); returns the exit
/// code: 0 after SIGINT/SIGTERM, 2 for bad arguments, 1 for a failure.
pub fn main_from_args(args: Vec<String>) -> i32 {
    let args =
        match Args::try_parse_from(std::iter::once("aio-vhost-user-blk".to_string()).chain(args)) {
            Ok(a) => a,
            Err(e) => {
                let code = if e.use_stderr() { 2 } else { 0 };
                let _ = e.print();
                return code;
            }
        };
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("aio-vhost-user-blk: {e}");
            match e {
                DaemonError::Disk { .. } | DaemonError::Conflict { .. } => 2,
                _ => 1,
            }
        }
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(io::Error::from)
}

type Plane = DataPlane<Box<dyn EventLoop>, Box<dyn IoEngine>>;

/// Serves the disks until SIGINT or SIGTERM.
pub fn run(args: &Args) -> Result<(), DaemonError> {
    distinct::check(&args.disks)?;
    let mut devices = Vec::new();
    for d in &args.disks {
        let options = DiskOptions {
            read_only: d.read_only,
            serial: d.serial.clone(),
            queues: d.queues,
            format: d.format,
        };
        let device = BlockDevice::open(&d.image, options).map_err(|e| DaemonError::Disk {
            spec: d.socket.display().to_string(),
            reason: e.to_string(),
        })?;
        devices.push(Arc::new(device));
    }
    let mut threads = Vec::new();
    for k in 0..usize::from(args.iothreads) {
        let (engine, fdmon) = (args.engine.clone(), args.fdmon.clone());
        let cpu = args.cpus.as_ref().map(|c| c.0[k % c.0.len()]);
        let poll = args.poll_max_ns.params();
        let thread = IoThread::spawn(&format!("iothread{k}"), move || -> io::Result<_> {
            if let Some(cpu) = cpu {
                pin(cpu)?;
            }
            let ctx = AioContext::new(backends::build_monitor(&fdmon)?).map_err(io::Error::from)?;
            ctx.set_poll_params(poll);
            let (engine, _name) = backends::build_engine(&engine)?;
            let plane: Plane = DataPlane::new(&ctx, engine).map_err(io::Error::from)?;
            Ok((ctx, plane))
        })
        .map_err(|e| DaemonError::Start(e.to_string()))?;
        threads.push(thread);
    }
    let handles = Arc::new(threads.iter().map(IoThread::handle).collect::<Vec<_>>());
    let monitor =
        backends::build_monitor(&args.fdmon).map_err(|e| DaemonError::Start(e.to_string()))?;
    let ctx = AioContext::new(monitor).map_err(|e| DaemonError::Start(e.to_string()))?;

    let stop = Arc::new(AtomicBool::new(false));
    let (flag, wake) = (stop.clone(), ctx.notify_handle());
    ctrlc::set_handler(move || {
        flag.store(true, Ordering::SeqCst);
        wake.notify();
    })
    .map_err(|e| DaemonError::Signals(e.to_string()))?;

    let mut sockets = Vec::new();
    for (i, (d, device)) in args.disks.iter().zip(&devices).enumerate() {
        match DiskSocket::serve(&ctx, i as u32, &d.socket, device.clone(), handles.clone()) {
            Ok(s) => sockets.push(s),
            Err(e) => {
                sockets
                    .iter()
                    .for_each(|s: &std::rc::Rc<DiskSocket<_, _>>| s.close(&ctx));
                return Err(DaemonError::Disk {
                    spec: d.socket.display().to_string(),
                    reason: e.to_string(),
                });
            }
        }
    }
    while !stop.load(Ordering::SeqCst) {
        ctx.poll(true);
    }
    for s in &sockets {
        s.close(&ctx);
    }
    drop(sockets);
    for t in threads {
        t.stop().map_err(|e| DaemonError::Start(e.to_string()))?;
    }
    Ok(())
}
