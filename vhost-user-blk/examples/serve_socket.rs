//! Serves one image over a vhost-user-blk socket with this crate's pieces alone: the device
//! (`aio-virtio-blk`), one iothread with the backends `auto` picks, and the disk's socket on
//! a control loop. The daemon (`aio-storage-daemon`) does the same with its command lines,
//! several disks and iothreads, QMP and signals.
//!
//! ```sh
//! truncate -s 1G /tmp/disk.img
//! cargo run --release -p aio-vhost-user-blk --example serve_socket -- /tmp/disk.img /tmp/vhost.sock
//! # then, for example:
//! qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
//!     -chardev socket,id=c0,path=/tmp/vhost.sock -device vhost-user-blk-pci,chardev=c0
//! ```
//!
//! It serves until killed (Ctrl-C); a program of its own would stop the loop and call
//! `DiskSocket::close` to drain the frontend's requests first.

use std::io;
use std::sync::Arc;

use aio::{EngineKind, EngineOptions, MonitorKind};
use aio_core::{EventLoop, IoEngine};
use aio_loop::{AioContext, IoThread};
use aio_vhost_user_blk::server::DiskSocket;
use aio_vhost_user_blk::vhost::DiskIndex;
use aio_virtio_blk::dataplane::DataPlane;
use aio_virtio_blk::device::{BlockDevice, DiskOptions};

type Plane = DataPlane<Box<dyn EventLoop>, Box<dyn IoEngine>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv = std::env::args().skip(1);
    let (Some(image), Some(socket)) = (argv.next(), argv.next()) else {
        eprintln!("usage: serve_socket IMAGE SOCKET");
        std::process::exit(2);
    };
    // The image, locked as QEMU locks a VM's disk.
    let device = Arc::new(BlockDevice::open(image.as_ref(), DiskOptions::default())?);

    // The iothread: its own loop, its engine, the queues it will be given.
    let iothread = IoThread::spawn("iothread0", || {
        let ctx = AioContext::new(MonitorKind::auto()?.built).map_err(io::Error::from)?;
        let engine = EngineKind::auto(&EngineOptions::default())?.built;
        let plane: Plane = DataPlane::new(&ctx, engine).map_err(io::Error::from)?;
        Ok::<_, io::Error>((ctx, plane))
    })?;

    // The control loop holds the socket and the connection's messages.
    let control = AioContext::new(MonitorKind::auto()?.built)?;
    let disk = DiskIndex {
        number: 0,
        first_queue: 0,
        iothread: None,
    };
    let _socket = DiskSocket::serve(
        &control,
        disk,
        socket.as_ref(),
        device,
        Arc::new(vec![iothread.handle()]),
    )?;
    println!("serving {image} on {socket}");
    loop {
        control.poll(true);
    }
}
