//! Serves one image over NBD on a Unix socket or a TCP port, on one thread: what an NBD
//! export of your own program takes (an image of the block layer, a server, a loop).
//!
//! ```text
//! qemu-img create -f qcow2 /var/tmp/disk.qcow2 1G
//! cargo run -p aio-nbd --example serve_image -- /var/tmp/disk.qcow2 unix:/tmp/nbd.sock
//! nbdinfo 'nbd+unix:///disk?socket=/tmp/nbd.sock'
//! qemu-img map --output=json 'nbd+unix:///disk?socket=/tmp/nbd.sock'
//! ```
//!
//! The second argument is `unix:PATH` or `HOST:PORT` (port 10809 is NBD's). The export is
//! named `disk` and writable; Ctrl-C ends the server (the image is closed cleanly only when
//! the process ends normally, so end it with `nbdsh -c 'h.shutdown()'` or use the daemon for
//! real work).

use std::rc::Rc;
use std::sync::Arc;

use aio::{AioContext, Choice, EngineKind, EngineOptions, MonitorKind};
use aio_block::format::ImageFormat;
use aio_block::{Image, ImageOptions};
use aio_nbd::{ExportSet, Limits, ListenAddr, NbdExport, NbdServer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, addr] = args.as_slice() else {
        eprintln!("usage: serve_image IMAGE unix:PATH|HOST:PORT");
        std::process::exit(2);
    };
    let addr: ListenAddr = addr.parse()?;
    // The format is found from the header: a qcow2 image is served as qcow2, anything else
    // as raw.
    let image = Image::open(image.as_ref(), ImageOptions::new(ImageFormat::Auto))?;
    let exports = ExportSet::new();
    exports.insert(NbdExport::new("disk", Arc::new(image))?.writable(true)?)?;

    let ctx = Rc::new(AioContext::new(Choice::<MonitorKind>::Auto.build()?.built)?);
    let options = EngineOptions::default().with_fallback_pool(true);
    let engine = Choice::<EngineKind>::Auto.build(&options)?;
    println!("engine: {}", engine.kind);
    let engine = ctx.attach_engine(engine.built, |_, _| {})?;

    let server = NbdServer::bind(&addr, exports, Limits::default(), None)?;
    let on = ctx.clone();
    // Every client is served on this thread's loop; a program with iothreads sends each
    // `Accepted` to one and calls `aio_nbd::serve` there.
    server.listen(&ctx, move |client| {
        if let Err(e) = aio_nbd::serve(&on, engine.clone(), client) {
            eprintln!("serve_image: a client could not be served: {e}");
        }
    })?;
    println!("serving 'disk' on {}", server.addr());
    loop {
        ctx.poll(true);
    }
}
