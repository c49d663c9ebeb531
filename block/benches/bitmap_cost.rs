//! What a recording dirty bitmap costs a write: random 4 KiB writes at QD 32 through an
//! `ImageQueue` on io_uring, on a 256 MiB raw file in `/dev/shm` (written whole first, so no
//! round pays tmpfs's first-write allocation) and on a raw image over the fast device (a loop
//! device with direct I/O over a tmpfs file, when run as root), with no bitmap and with one;
//! and on a preallocated qcow2 image in `/dev/shm`, with no bitmap and with one *persistent*
//! bitmap, which the image keeps consistent on disk while it is open (`qcow2/durable.rs`: a
//! write first checks that its granules' bits are on disk, and writes a bitmap cluster the
//! first time a chunk is dirtied).
//!
//! The two are measured alternately, a round of each at a time, in one process (so that the
//! machine's drift between rounds hits both alike), and the median of the rounds' ratios is
//! printed: IOPS with one recording bitmap over none, with the range. No figure is asserted.
//!
//! Run: `cargo bench -p aio-block --bench bitmap_cost` (`AIO_BENCH_ROUNDS`, default 15;
//! `AIO_BENCH_BATCHES` per round, default 2000).

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aio::poll::PollLoop;
use aio::{AioContext, EngineKind, EngineOptions, IoEngine};
use aio_block::bitmap::BitmapOptions;
use aio_block::format::ImageFormat;
use aio_block::{BlockRequest, Image, ImageOptions, ImageQueue, LentMemory, Reply};
use aio_core::engine::AlignedBuf;

const DEPTH: usize = 32;
const BLOCK: usize = 4096;
const FILE_BYTES: u64 = 256 << 20;

/// How many requests have ended.
#[derive(Default)]
struct Ended {
    count: Cell<usize>,
    failed: RefCell<Option<std::io::Error>>,
}

impl Reply for Ended {
    type Tag = ();
    fn finish(&self, _: (), result: std::io::Result<()>) {
        self.count.set(self.count.get() + 1);
        if let Err(e) = result {
            *self.failed.borrow_mut() = Some(e);
        }
    }
}

struct Bench {
    ctx: AioContext<PollLoop>,
    queue: ImageQueue<PollLoop, Box<dyn IoEngine>>,
    ended: Rc<Ended>,
    bufs: Vec<Arc<AlignedBuf>>,
    seed: u64,
}

impl Bench {
    fn new(image: &Arc<Image>) -> Bench {
        let ctx = AioContext::new(PollLoop::new()).unwrap();
        let engine = EngineKind::Uring
            .build(&EngineOptions::default())
            .or_else(|_| EngineKind::Pool.build(&EngineOptions::default()))
            .unwrap();
        let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
        let bufs = (0..DEPTH)
            .map(|i| Arc::new(AlignedBuf::from_slice(&[i as u8; BLOCK])))
            .collect();
        Bench {
            queue: image.queue(engine),
            ctx,
            ended: Rc::default(),
            bufs,
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// `DEPTH` random writes, run to their ends.
    fn batch(&mut self) {
        let blocks = FILE_BYTES / BLOCK as u64;
        let start = self.ended.count.get();
        self.queue.plug();
        for buf in &self.bufs {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            let offset = (self.seed % blocks) * BLOCK as u64;
            // SAFETY: the buffer lives in an Arc the hold keeps until the request's end, and
            // nothing writes it meanwhile: the engine only reads a write's memory, and each
            // buffer is lent to one request of a batch, the next batch after this one ended.
            let buffers =
                unsafe { LentMemory::new([(buf.as_ptr() as *mut u8, BLOCK)], Some(buf.clone())) };
            let write = BlockRequest::Write {
                offset,
                buffers,
                fua: false,
            };
            self.queue.submit(&self.ctx, &self.ended, write, ());
        }
        self.queue.unplug(&self.ctx);
        while self.ended.count.get() < start + DEPTH {
            self.ctx.poll(true);
        }
        if let Some(e) = self.ended.failed.borrow_mut().take() {
            panic!("a write failed: {e}");
        }
    }

    fn round(&mut self, batches: usize) -> Duration {
        let started = Instant::now();
        for _ in 0..batches {
            self.batch();
        }
        started.elapsed()
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One disk: rounds with and without a bitmap (`persistent` or not), alternated; prints the
/// median ratio.
fn measure(label: &str, path: &Path, format: ImageFormat, persistent: bool) {
    let (rounds, batches) = (env("AIO_BENCH_ROUNDS", 15), env("AIO_BENCH_BATCHES", 2000));
    let image = Arc::new(Image::open(path, ImageOptions::new(format)).unwrap());
    let mut bench = Bench::new(&image);
    bench.round(batches / 4); // warm up
    let mut ratios = Vec::new();
    let (mut none_total, mut one_total) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let none = bench.round(batches);
        let options = BitmapOptions::new().persistent(persistent);
        let bitmap = image.add_dirty_bitmap("b", options).unwrap();
        let one = bench.round(batches);
        assert!(bitmap.count() > 0, "the writes dirtied the bitmap");
        image.dirty_bitmaps().remove("b").unwrap();
        // IOPS with one over none: time without over time with.
        ratios.push(none.as_secs_f64() / one.as_secs_f64());
        none_total += none;
        one_total += one;
    }
    ratios.sort_by(f64::total_cmp);
    let requests = (rounds * batches * DEPTH) as f64;
    println!(
        "{label}: IOPS with one recording{} bitmap / none: median {:.3} (range {:.3}-{:.3}, \
         {rounds} rounds); {:.0} k IOPS none, {:.0} k with one",
        if persistent { " persistent" } else { "" },
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        requests / none_total.as_secs_f64() / 1e3,
        requests / one_total.as_secs_f64() / 1e3,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not served.
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("disk.img");
    let chunk = vec![0xa5u8; 1 << 20];
    let mut file = std::fs::File::create(&path).unwrap();
    for _ in 0..FILE_BYTES / (1 << 20) {
        file.write_all(&chunk).unwrap();
    }
    drop(file);
    measure("raw file in /dev/shm", &path, ImageFormat::Raw, false);

    // A preallocated qcow2 image (no write allocates), with a persistent bitmap.
    let qcow2 = dir.path().join("disk.qcow2");
    let made = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-o", "preallocation=full"])
        .arg(&qcow2)
        .arg(FILE_BYTES.to_string())
        .status();
    match made {
        Ok(s) if s.success() && cfg!(feature = "qcow2") => {
            measure("qcow2 in /dev/shm", &qcow2, ImageFormat::Qcow2, true);
            std::fs::remove_file(&qcow2).unwrap();
        }
        _ => println!("qcow2 in /dev/shm: not measured (needs qemu-img and the qcow2 feature)"),
    }

    // The fast device, as root.
    let out = Command::new("losetup")
        .args(["--find", "--show", "--direct-io=on"])
        .arg(&path)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let dev = Path::new(&dev);
            measure(
                "loop device (direct I/O over tmpfs)",
                dev,
                ImageFormat::Raw,
                false,
            );
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
        _ => println!("loop device: not measured (needs root and losetup)"),
    }
}
