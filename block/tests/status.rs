//! Block status against `qemu-img map` of the same image: a raw file, a qcow2 overlay over a
//! backing chain (data, zero clusters, discarded clusters, backing data), and a qcow2 image
//! with preallocated metadata: the same ranges of data and holes. Needs `qemu-img` and
//! `qemu-io` (Debian's `qemu-utils`; `.ci/run` installs it).

mod common;

use std::path::Path;

use aio_block::status::{raw_extents, Extent, ExtentKind};
#[cfg(feature = "qcow2")]
use aio_block::{Image, ImageOptions};

fn run(program: &str, args: &[&str]) -> String {
    common::run_in(Path::new("."), program, args)
}

/// `qemu-img map`'s answer for an image of `format` as extents, neighbours of one kind merged.
fn qemu_map(image: &Path, format: &str) -> Vec<Extent> {
    let json = run(
        "qemu-img",
        &[
            "map",
            "-U",
            "--output=json",
            "-f",
            format,
            image.to_str().unwrap(),
        ],
    );
    let entries: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut out: Vec<Extent> = Vec::new();
    for e in entries.as_array().unwrap() {
        let (offset, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        let kind = match e["data"].as_bool().unwrap() {
            true => ExtentKind::Data,
            false => ExtentKind::Hole,
        };
        match out.last_mut() {
            Some(last) if last.kind == kind => last.len += len,
            _ => out.push(Extent { offset, len, kind }),
        }
    }
    out
}

#[test]
fn a_raw_images_extents_are_qemu_img_maps() {
    let dir = aio_test_support::images::memory_dir("block-test");
    let image = dir.path().join("sparse.raw");
    let i = image.to_str().unwrap();
    run("qemu-img", &["create", "-q", "-f", "raw", i, "64M"]);
    for (at, len) in [("1M", "512k"), ("8M", "4k"), ("40M", "3M"), ("63M", "1M")] {
        let write = format!("write -P 0x5a {at} {len}");
        run("qemu-io", &["-f", "raw", "-c", &write, i]);
    }
    let file = std::fs::File::open(&image).unwrap();
    let ours = raw_extents(&file, 64 << 20, 0, 64 << 20).unwrap();
    assert_eq!(ours, qemu_map(&image, "raw"));
    assert!(
        ours.iter().any(|e| e.kind == ExtentKind::Hole),
        "the file system kept holes: {ours:?}"
    );
}

/// `ImageQueue::block_status` on a context of this thread, the loop run until it answers.
#[cfg(feature = "qcow2")]
fn status_on_queue(
    image: &std::sync::Arc<Image>,
    engine: Box<dyn aio::IoEngine>,
    offset: u64,
    len: u64,
) -> Vec<Extent> {
    let ctx = aio::AioContext::new(aio::poll::PollLoop::new()).unwrap();
    let queue = image.queue(ctx.attach_engine(engine, |_, _| {}).unwrap());
    let answer = std::rc::Rc::new(std::cell::RefCell::new(None));
    let slot = answer.clone();
    queue.block_status(&ctx, offset, len, move |found| {
        *slot.borrow_mut() = Some(found.unwrap())
    });
    while answer.borrow().is_none() {
        ctx.poll(true);
    }
    let found = answer.borrow_mut().take().unwrap();
    found
}

/// A directory for images opened `O_DIRECT` whose file system keeps holes (`/var/tmp`, as the
/// other image tests use).
fn holey_dir() -> tempfile::TempDir {
    aio_test_support::images::image_dir("block-test")
}

#[cfg(feature = "qcow2")]
#[test]
fn a_qcow2_chains_extents_are_qemu_img_maps() {
    let dir = holey_dir();
    let at = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (base, top) = (at("base.qcow2"), at("top.qcow2"));
    run("qemu-img", &["create", "-q", "-f", "qcow2", &base, "64M"]);
    run(
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x11 0 256k", &base],
    );
    run(
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x12 20M 1M", &base],
    );
    let backed = [
        "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", &base, &top,
    ];
    run("qemu-img", &backed);
    for cmd in [
        "write -P 0x21 1M 128k",
        "write -P 0x22 8M 64k",
        "write -z 20M 512k",
        "write -P 0x23 30M 2M",
        "discard 31M 512k",
        "write -P 0x24 63M 1M",
    ] {
        run("qemu-io", &["-f", "qcow2", "-c", cmd, &top]);
    }
    let image = Image::open(Path::new(&top), ImageOptions::default()).unwrap();
    let ours = image.block_status(0, 64 << 20).unwrap();
    assert_eq!(ours, qemu_map(Path::new(&top), "qcow2"));
    // The same answer from a queue's context on every engine, without blocking it, and the
    // same past the end.
    let image = std::sync::Arc::new(image);
    for (kind, engine) in common::engines() {
        let on_queue = status_on_queue(&image, engine, 0, 65 << 20);
        let mut whole = ours.clone();
        let past = Extent {
            offset: 64 << 20,
            len: 1 << 20,
            kind: ExtentKind::Hole,
        };
        assert_eq!(
            whole.last().unwrap().kind,
            ExtentKind::Data,
            "written at 63M"
        );
        whole.push(past);
        assert_eq!(on_queue, whole, "{kind}");
    }
    let image = std::sync::Arc::try_unwrap(image).unwrap();
    // A raw image's answer is its file's, on the queue as off it.
    let raw = at("sparse.raw");
    run("qemu-img", &["create", "-q", "-f", "raw", &raw, "8M"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 1 2M 64k", &raw]);
    let raw = std::sync::Arc::new(Image::open(Path::new(&raw), ImageOptions::default()).unwrap());
    let (_, engine) = common::engines().remove(0);
    let blocking = raw.block_status(0, 8 << 20).unwrap();
    assert_eq!(status_on_queue(&raw, engine, 0, 8 << 20), blocking);
    assert!(blocking.len() > 1, "{blocking:?}");
    assert!(ours.iter().any(|e| e.kind == ExtentKind::Hole), "{ours:?}");
    // A range inside, and one past the end.
    // Unallocated with nothing beneath, then a zero cluster over the backing file's data.
    let part = image.block_status((20 << 20) - 4096, 8192).unwrap();
    let hole = Extent {
        offset: (20 << 20) - 4096,
        len: 8192,
        kind: ExtentKind::Hole,
    };
    assert_eq!(part, [hole]);
    let past = image.block_status(64 << 20, 4096).unwrap();
    assert_eq!(
        past,
        [Extent {
            offset: 64 << 20,
            len: 4096,
            kind: ExtentKind::Hole
        }]
    );

    // Preallocated metadata: clusters mapped but never written are data, as QEMU says.
    let pre = at("pre.qcow2");
    let create = [
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "preallocation=metadata",
        &pre,
        "16M",
    ];
    run("qemu-img", &create);
    run(
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x31 4M 64k", &pre],
    );
    let image = Image::open(Path::new(&pre), ImageOptions::default()).unwrap();
    assert_eq!(
        image.block_status(0, 16 << 20).unwrap(),
        qemu_map(Path::new(&pre), "qcow2")
    );
}

#[test]
fn the_null_image_is_all_holes_and_a_window_its_files_part() {
    let null = aio_block::Image::null(1 << 20, aio_block::ImageOptions::default()).unwrap();
    let all = null.block_status(0, 2 << 20).unwrap();
    assert_eq!(
        all,
        [Extent {
            offset: 0,
            len: 2 << 20,
            kind: ExtentKind::Hole
        }]
    );

    let dir = holey_dir();
    let path = dir.path().join("disk.raw");
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(4 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[7u8; 65536], 2 << 20).unwrap();
    let io_file = aio_core::engine::IoFile::new(file);
    let window = aio_block::Image::window(io_file, 1 << 20, 2 << 20, Default::default()).unwrap();
    let extents = window.block_status(0, 2 << 20).unwrap();
    if extents.len() == 1 {
        println!("skipped: this file system keeps no holes");
        return;
    }
    let e = |offset, len, kind| Extent { offset, len, kind };
    assert_eq!(
        extents,
        [
            e(0, 1 << 20, ExtentKind::Hole),
            e(1 << 20, 65536, ExtentKind::Data),
            e((1 << 20) + 65536, (1 << 20) - 65536, ExtentKind::Hole),
        ]
    );
}
