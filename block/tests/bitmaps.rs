//! Dirty bitmaps on the request path: every write, write-zeroes and discard an
//! `ImageQueue` runs dirties the image's recording bitmaps when it ends, on raw, qcow2 and
//! null images and on every engine this machine has; reads and flushes dirty nothing, a
//! disabled bitmap records nothing, a bitmap added while a write is in flight is dirtied by
//! it, and a resize grows the bitmaps with the image.

mod common;

use std::sync::Arc;

use aio_block::bitmap::BitmapOptions;
use aio_block::format::ImageFormat;
use aio_block::{BlockRequest, Image, ImageOptions, LentMemory};
use aio_core::engine::AlignedBuf;
use common::session::Session;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// A raw image of `bytes` zeros in a directory of its own (kept while the directory lives).
fn raw_image(bytes: usize) -> (tempfile::TempDir, Arc<Image>) {
    let dir = aio_test_support::images::image_dir("block-bitmaps");
    let path = dir.path().join("disk.img");
    std::fs::write(&path, vec![0u8; bytes]).unwrap();
    let image = Image::open(&path, ImageOptions::new(ImageFormat::Raw)).unwrap();
    (dir, Arc::new(image))
}

/// Writes, zeroes and discards through `s`, and checks what the bitmaps of its image say.
fn dirty_through(s: &Session, name: &str) {
    let image = s.queue.image().clone();
    let on = image
        .add_dirty_bitmap("on", BitmapOptions::new().granularity(64 << 10))
        .unwrap();
    let off = image
        .add_dirty_bitmap("off", BitmapOptions::new().disabled(true))
        .unwrap();
    s.write(MIB, &[1; 4096], false).unwrap();
    s.run(BlockRequest::WriteZeroes {
        offset: 2 * MIB + 60 * KIB,
        len: 8 * KIB,
        unmap: false,
    })
    .unwrap();
    s.run(BlockRequest::Discard {
        offset: 3 * MIB,
        len: 64 * KIB,
    })
    .unwrap();
    let (r, _) = s.read(0, 64 << 10);
    r.unwrap();
    s.run(BlockRequest::Flush).unwrap();
    let dirty: Vec<(u64, u64)> = on
        .extents(0, image.size())
        .into_iter()
        .filter(|e| e.2)
        .map(|e| (e.0, e.1))
        .collect();
    assert_eq!(
        dirty,
        vec![(MIB, 64 * KIB), (2 * MIB, 128 * KIB), (3 * MIB, 64 * KIB)],
        "{name}"
    );
    assert_eq!(off.count(), 0, "{name}: a disabled bitmap recorded");
    // A refused request (past the end) ran nothing and dirtied nothing.
    let before = on.count();
    assert!(s.write(image.size(), &[1; 4096], false).is_err());
    assert_eq!(on.count(), before, "{name}");
}

#[test]
fn writes_zeroes_and_discards_dirty_a_raw_images_bitmaps_on_every_engine() {
    for (kind, engine) in common::engines() {
        let (_dir, image) = raw_image(4 << 20);
        // A raw file has no clusters: QEMU's default of 64 KiB.
        let default = image
            .add_dirty_bitmap("default", BitmapOptions::new())
            .unwrap();
        assert_eq!(default.granularity(), 65536);
        let s = Session::new(&image, engine);
        dirty_through(&s, &kind.to_string());
    }
}

#[cfg(feature = "qcow2")]
#[test]
fn a_qcow2_images_bitmaps_are_dirtied_and_default_to_its_cluster_size() {
    if !aio_test_support::tool::installed("qemu-img") {
        aio_conformance::skip("qemu-img is not installed");
        return;
    }
    for (kind, engine) in common::engines() {
        let dir = aio_test_support::images::image_dir("block-bitmaps");
        common::run_in(
            dir.path(),
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-o",
                "cluster_size=16k",
                "d.qcow2",
                "4M",
            ],
        );
        let path = dir.path().join("d.qcow2");
        let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
        let default = image
            .add_dirty_bitmap("default", BitmapOptions::new())
            .unwrap();
        assert_eq!(default.granularity(), 16384);
        let s = Session::new(&image, engine);
        dirty_through(&s, &format!("qcow2 on {kind}"));
    }
}

#[test]
fn the_null_images_writes_dirty_its_bitmaps_too() {
    let image = Arc::new(Image::null(4 * MIB, ImageOptions::default()).unwrap());
    let (_, engine) = common::engines().into_iter().next().expect("an engine");
    let s = Session::new(&image, engine);
    dirty_through(&s, "null");
}

#[test]
fn a_bitmap_added_while_a_write_is_in_flight_is_dirtied_by_it() {
    for (kind, engine) in common::engines() {
        let (_dir, image) = raw_image(4 << 20);
        let s = Session::new(&image, engine);
        // The write is submitted; its end is told on this thread's next poll, after the add.
        let (buffers, _) = LentMemory::from_aligned(AlignedBuf::from_slice(&[7; 4096]));
        s.queue.plug();
        let write = BlockRequest::Write {
            offset: MIB,
            buffers,
            fua: false,
        };
        s.queue.submit(&s.ctx, &s.ends, write, 99);
        s.queue.unplug(&s.ctx);
        let late = image
            .add_dirty_bitmap("late", BitmapOptions::new())
            .unwrap();
        while s.ends.done.borrow().is_empty() {
            s.ctx.poll(true);
        }
        s.ends.done.borrow_mut().pop().unwrap().1.unwrap();
        assert!(late.is_dirty(MIB), "{kind}");
    }
}

#[test]
fn a_resize_grows_the_bitmaps_with_the_image() {
    let (_dir, image) = raw_image(4 << 20);
    let b = image.add_dirty_bitmap("b", BitmapOptions::new()).unwrap();
    image.resize(8 * MIB).unwrap();
    assert_eq!(b.size(), 8 * MIB);
    let (_, engine) = common::engines().into_iter().next().expect("an engine");
    let s = Session::new(&image, engine);
    s.write(7 * MIB, &[1; 4096], false).unwrap();
    assert!(b.is_dirty(7 * MIB));
    assert_eq!(b.count(), 64 * KIB);
}

/// A reply that owns its queue (as an NBD connection or a virtqueue does).
struct Owning {
    queue: std::cell::RefCell<
        Option<aio_block::ImageQueue<aio::poll::PollLoop, Box<dyn aio::IoEngine>>>,
    >,
    ended: std::cell::Cell<bool>,
}

impl aio_block::Reply for Owning {
    type Tag = ();
    fn finish(&self, _: (), result: std::io::Result<()>) {
        result.unwrap();
        self.ended.set(true);
    }
}

#[test]
fn a_reply_that_owns_its_queue_is_not_kept_alive_by_the_filter() {
    let (_dir, image) = raw_image(1 << 20);
    let weak_image = Arc::downgrade(&image);
    let ctx = aio::AioContext::new(aio::poll::PollLoop::new()).unwrap();
    let (_, engine) = common::engines().into_iter().next().expect("an engine");
    let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
    let reply = std::rc::Rc::new(Owning {
        queue: std::cell::RefCell::new(Some(image.queue(engine))),
        ended: std::cell::Cell::new(false),
    });
    drop(image);
    let (buffers, _) = LentMemory::from_aligned(AlignedBuf::from_slice(&[7; 4096]));
    let write = BlockRequest::Write {
        offset: 0,
        buffers,
        fua: false,
    };
    let queue = reply.queue.borrow();
    let q = queue.as_ref().unwrap();
    q.plug();
    q.submit(&ctx, &reply, write, ());
    q.unplug(&ctx);
    drop(queue);
    while !reply.ended.get() {
        ctx.poll(true);
    }
    let weak_reply = std::rc::Rc::downgrade(&reply);
    drop(reply);
    assert!(weak_reply.upgrade().is_none(), "the reply was kept alive");
    assert!(
        weak_image.upgrade().is_none(),
        "the image (its file) was kept open"
    );
}
