//! Opens a qcow2 image through the block layer alone (no virtio, no daemon), writes a pattern,
//! reads it back and flushes, on the engine of your choice: what an export of your own
//! (a protocol server, a VMM's device) does with an image.
//!
//! ```text
//! qemu-img create -f qcow2 /var/tmp/disk.qcow2 64M
//! cargo run -p aio-block --example qcow2_image -- /var/tmp/disk.qcow2 [auto|uring|linux-aio|pool]
//! qemu-img check /var/tmp/disk.qcow2 && qemu-io -c 'read -P 0x5a 1M 64k' /var/tmp/disk.qcow2
//! ```
//!
//! The image is locked as QEMU locks one (a running `qemu-io` on it is refused, and it
//! refuses us). `O_DIRECT` needs a file system that has it (not tmpfs).

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio::poll::PollLoop;
use aio::{AioContext, Choice, EngineKind, EngineOptions};
use aio_block::format::ImageFormat;
use aio_block::{BlockRequest, Image, ImageOptions, ImageQueue, LentMemory, Reply};
use aio_core::engine::{AlignedBuf, IoEngine};

/// Where requests end: here, a slot per request the example waits on.
#[derive(Default)]
struct Ends(RefCell<Vec<(&'static str, io::Result<()>)>>);

impl Reply for Ends {
    /// What the request was, for the printout.
    type Tag = &'static str;

    fn finish(&self, tag: &'static str, result: io::Result<()>) {
        self.0.borrow_mut().push((tag, result));
    }
}

/// Submits `request` and runs the loop until it has ended.
fn run<E: IoEngine + 'static>(
    ctx: &AioContext<PollLoop>,
    queue: &ImageQueue<PollLoop, E>,
    ends: &Rc<Ends>,
    what: &'static str,
    request: BlockRequest,
) -> io::Result<()> {
    queue.plug();
    queue.submit(ctx, ends, request, what);
    queue.unplug(ctx);
    loop {
        if let Some((tag, result)) = ends.0.borrow_mut().pop() {
            println!("{tag}: {}", if result.is_ok() { "ok" } else { "failed" });
            return result;
        }
        ctx.poll(true);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: qcow2_image IMAGE.qcow2 [ENGINE]");
        std::process::exit(2);
    };
    // `auto` (the default) climbs io_uring, Linux AIO, the thread pool: the first that
    // this kernel allows.
    let choice: Choice<EngineKind> = args.next().as_deref().unwrap_or("auto").parse()?;
    let image = Image::open(path.as_ref(), ImageOptions::new(ImageFormat::Qcow2))?;
    let image = Arc::new(image);
    println!(
        "{path}: {} of {} bytes, backing chain {:?}",
        image.format_name(),
        image.size(),
        image.backing_chain()
    );

    let ctx = AioContext::new(PollLoop::new())?;
    let engine = choice.build(&EngineOptions::default().with_fallback_pool(true))?;
    println!("engine: {}", engine.kind);
    let queue = image.queue(ctx.attach_engine(engine.built, |_, _| {})?);
    let ends = Rc::new(Ends::default());

    // The block layer reads and writes straight from and into the memory it is given: here
    // an aligned buffer it hands back once the request has ended.
    let offset = 1 << 20;
    let (buffers, _) = LentMemory::from_aligned(AlignedBuf::from_slice(&[0x5a; 64 << 10]));
    let write = BlockRequest::Write {
        offset,
        buffers,
        fua: false,
    };
    run(&ctx, &queue, &ends, "write 64 KiB at 1 MiB", write)?;
    let (buffers, back) = LentMemory::from_aligned(AlignedBuf::new(64 << 10));
    let read = BlockRequest::Read { offset, buffers };
    run(&ctx, &queue, &ends, "read it back", read)?;
    let data = back.take().map_err(|_| "the read's buffer is still held")?;
    if !data.iter().all(|&b| b == 0x5a) {
        return Err("the data read back is not what was written".into());
    }
    run(&ctx, &queue, &ends, "flush", BlockRequest::Flush)?;

    drop(queue);
    // Writes the image's cached metadata and syncs it (dropping the image does it too).
    image.close()?;
    println!("closed: `qemu-img check {path}` finds no errors");
    Ok(())
}
