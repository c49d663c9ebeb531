//! RBD images through the block layer: a raw disk in a one-node Ceph cluster served by an
//! `ImageQueue` as files are (reads and writes in the caller's memory, FUA, flush, discard,
//! write-zeroes, block status, resize), the format rule, and the exclusive lock against a
//! second writer.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio::poll::PollLoop;
use aio::{AioContext, IoEngine};
use aio_block::format::ImageFormat;
use aio_block::image::OpenError;
use aio_block::status::ExtentKind;
use aio_block::{BlockRequest, Image, ImageOptions, ImageQueue, LentMemory, Reply};
use aio_core::engine::AlignedBuf;
use aio_rbd::testing::TestCluster;
use aio_rbd::{ImageSpec, RbdError, RbdTarget};

const MIB: u64 = 1 << 20;

#[derive(Default)]
struct Ends(RefCell<Vec<(u32, io::Result<()>)>>);

impl Reply for Ends {
    type Tag = u32;
    fn finish(&self, tag: u32, result: io::Result<()>) {
        self.0.borrow_mut().push((tag, result));
    }
}

struct Session {
    ctx: AioContext<PollLoop>,
    queue: ImageQueue<PollLoop, Box<dyn IoEngine>>,
    ends: Rc<Ends>,
}

impl Session {
    fn new(image: &Arc<Image>) -> Self {
        let ctx = AioContext::new(PollLoop::new()).unwrap();
        let engine: Box<dyn IoEngine> =
            Box::new(aio::pool::ThreadPool::new(aio::pool::PoolConfig::default()).unwrap());
        let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
        Session {
            queue: image.queue(engine),
            ctx,
            ends: Rc::default(),
        }
    }

    fn run(&self, request: BlockRequest) -> io::Result<()> {
        self.queue.submit(&self.ctx, &self.ends, request, 7);
        assert!(self.ends.0.borrow().is_empty() || self.ends.0.borrow()[0].1.is_err());
        while self.ends.0.borrow().is_empty() {
            self.ctx.poll(true);
        }
        self.ends.0.borrow_mut().pop().unwrap().1
    }

    fn write(&self, offset: u64, byte: u8, len: usize, fua: bool) -> io::Result<()> {
        let mut buf = AlignedBuf::new(len);
        buf.fill(byte);
        let (buffers, _back) = LentMemory::from_aligned(buf);
        self.run(BlockRequest::Write {
            offset,
            buffers,
            fua,
        })
    }

    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let (buffers, back) = LentMemory::from_aligned(AlignedBuf::new(len));
        self.run(BlockRequest::Read { offset, buffers }).unwrap();
        back.take().expect("the memory came back").to_vec()
    }
}

fn target(test: &TestCluster, spec: &ImageSpec) -> RbdTarget {
    test.qemu_name(spec).parse().unwrap()
}

#[test]
fn an_rbd_disk_is_served_as_a_file_is() {
    let Some(test) = TestCluster::get() else {
        return;
    };
    let cluster = test.connect();
    let spec = TestCluster::new_image(&cluster, "block", 64 * MIB);
    let image =
        Arc::new(Image::open_rbd(&target(&test, &spec), ImageOptions::default(), None).unwrap());
    assert_eq!((image.size(), image.format_name()), (64 * MIB, "raw"));
    assert_eq!(image.path().to_str(), Some(format!("rbd:{spec}").as_str()));
    let s = Session::new(&image);

    s.write(MIB, 0x11, 64 << 10, false).unwrap();
    s.write(2 * MIB, 0x22, 4096, true).unwrap();
    s.run(BlockRequest::Flush).unwrap();
    assert!(s.read(MIB, 64 << 10).iter().all(|&b| b == 0x11));
    assert!(s.read(2 * MIB, 4096).iter().all(|&b| b == 0x22));
    s.run(BlockRequest::WriteZeroes {
        offset: MIB,
        len: 4096,
        unmap: false,
    })
    .unwrap();
    assert!(s.read(MIB, 8192)[..4096].iter().all(|&b| b == 0));
    // Discard is advisory: librbd ignores one below its granularity (64 KiB), and says so
    // with success.
    s.run(BlockRequest::Discard {
        offset: MIB + 4096,
        len: 4096,
    })
    .unwrap();
    // Past the end: refused before librbd sees it.
    let e = s
        .run(BlockRequest::Discard {
            offset: 64 * MIB,
            len: 4096,
        })
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));

    // Block status: the written object is data, the rest holes, on the loop and blocking.
    let object = image.rbd().unwrap().object_size();
    let answer = Rc::new(RefCell::new(None));
    let a = answer.clone();
    s.queue.block_status(&s.ctx, 0, 64 * MIB + 4096, move |r| {
        *a.borrow_mut() = Some(r)
    });
    while answer.borrow().is_none() {
        s.ctx.poll(true);
    }
    let extents = answer.borrow_mut().take().unwrap().unwrap();
    assert_eq!(extents, image.block_status(0, 64 * MIB + 4096).unwrap());
    let data: Vec<_> = extents
        .iter()
        .filter(|e| e.kind == ExtentKind::Data)
        .map(|e| (e.offset, e.len))
        .collect();
    assert_eq!(data, vec![(0, object)], "{extents:?}");
    assert_eq!(extents.last().unwrap().kind, ExtentKind::Hole);

    // A probed raw image keeps sector 0 free of a format's magic.
    let mut qcow = AlignedBuf::new(4096);
    qcow[..4].copy_from_slice(b"QFI\xfb");
    let (buffers, _back) = LentMemory::from_aligned(qcow);
    let e = s
        .run(BlockRequest::Write {
            offset: 0,
            buffers,
            fua: false,
        })
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));

    // Resize grows what the cluster has; the image's size follows.
    image.resize(128 * MIB).unwrap();
    assert_eq!(image.rbd().unwrap().size().unwrap(), 128 * MIB);
    s.write(127 * MIB, 0x33, 4096, false).unwrap();

    // A second writer is refused at open, naming the holder; a reader is not.
    let e = Image::open_rbd(&target(&test, &spec), ImageOptions::default(), None).unwrap_err();
    assert!(matches!(&e, OpenError::Rbd(RbdError::Locked { .. })), "{e}");
    assert!(e.to_string().contains("locked by"), "{e}");
    let reader = Image::open_rbd(
        &target(&test, &spec),
        ImageOptions::default().read_only(true),
        None,
    )
    .unwrap();
    let mut head = vec![0u8; 4096];
    reader.rbd().unwrap().read_at(127 * MIB, &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0x33));
    drop(reader);
    drop(s);
    image.close().unwrap();
    assert_eq!(
        image.rbd().unwrap().lock_owners().err().map(|e| e.errno()),
        Some(Some(libc::EBADF))
    );
}

/// A qcow2 image imported into RBD (`rbd import`) is served as qcow2 (`format=auto` finds
/// it): its writes allocate clusters past the RBD image's end, which grows; exported back to a
/// file (`rbd export`), `qemu-img check` finds it clean and `qemu-io` reads what was written.
#[test]
fn a_qcow2_image_in_rbd_is_served_as_qcow2() {
    let Some(test) = TestCluster::get() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("out.qcow2");
    let run = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let spec = ImageSpec::new("rbd", &TestCluster::unique_name("qcow2"));
    test.import_new_qcow2(&spec, "64M");
    let image =
        Arc::new(Image::open_rbd(&target(&test, &spec), ImageOptions::default(), None).unwrap());
    assert_eq!((image.format_name(), image.size()), ("qcow2", 64 * MIB));
    let s = Session::new(&image);
    s.write(0, 0x11, 64 << 10, false).unwrap();
    s.write(32 * MIB, 0x22, 128 << 10, true).unwrap();
    s.run(BlockRequest::Flush).unwrap();
    assert!(s.read(32 * MIB, 128 << 10).iter().all(|&b| b == 0x22));
    assert!(
        s.read(MIB, 4096).iter().all(|&b| b == 0),
        "unallocated reads as zeros"
    );
    drop(s);
    image.close().unwrap();
    drop(image);
    test.rbd(&["export", &spec.to_string(), back.to_str().unwrap()]);
    run("qemu-img", &["check", "-q", back.to_str().unwrap()]);
    let read = run(
        "qemu-io",
        &[
            "-c",
            "read -P 0x22 32M 128k",
            "-c",
            "read -P 0x11 0 64k",
            back.to_str().unwrap(),
        ],
    );
    assert!(!read.contains("verification failed"), "{read}");
}

/// A qcow2 image in RBD that names a backing file is refused, saying what to do.
#[test]
fn a_qcow2_image_in_rbd_with_a_backing_file_is_refused() {
    let Some(test) = TestCluster::get() else {
        return;
    };
    let cluster = test.connect();
    let spec = TestCluster::new_image(&cluster, "qcow2b", 16 * MIB);
    let raw = Image::open_rbd(
        &target(&test, &spec),
        ImageOptions::new(ImageFormat::Raw),
        None,
    )
    .unwrap();
    let mut header = vec![0u8; 512];
    header[..4].copy_from_slice(b"QFI\xfb");
    header[7] = 3;
    // A backing file name at byte 200, 4 bytes long.
    header[15] = 200;
    header[19] = 4;
    header[200..204].copy_from_slice(b"base");
    // 64 KiB clusters, 16 MiB, no tables (never reached: refused before).
    header[23] = 16;
    header[24..32].copy_from_slice(&(16 * MIB).to_be_bytes());
    // Header length (version 3): 104 bytes.
    header[103] = 104;
    let s = Session::new(&Arc::new(raw));
    let (buffers, _back) = LentMemory::from_aligned({
        let mut b = AlignedBuf::new(512);
        b.copy_from_slice(&header);
        b
    });
    s.run(BlockRequest::Write {
        offset: 0,
        buffers,
        fua: true,
    })
    .unwrap();
    drop(s);
    let e = Image::open_rbd(&target(&test, &spec), ImageOptions::default(), None).unwrap_err();
    assert!(
        matches!(
            e,
            OpenError::FormatNotServed { .. } | OpenError::Qcow2Refused { .. }
        ),
        "{e}"
    );
}

/// An RBD disk handed over between two users (two clients of the cluster): B, opened
/// inactive, reads A's writes and refuses the rest (`EPERM`); its activation is refused while
/// A holds the exclusive lock, and succeeds once A is inactive, when A is the one refused.
#[test]
fn an_rbd_disk_is_handed_over_with_its_exclusive_lock() {
    let Some(test) = TestCluster::get() else {
        return;
    };
    let cluster = test.connect();
    let spec = TestCluster::new_image(&cluster, "handover", 16 * MIB);
    let options = ImageOptions::new(ImageFormat::Raw);
    let at = target(&test, &spec);
    let a = Arc::new(Image::open_rbd(&at, options.clone(), None).unwrap());
    let b = Arc::new(Image::open_rbd_inactive(&at, options, None).unwrap());
    assert!(a.rbd_lock().is_some() && b.rbd_lock().is_none() && !b.is_active());
    let (sa, sb) = (Session::new(&a), Session::new(&b));
    sa.write(MIB, 0x11, 4096, true).unwrap();
    assert!(sb.read(MIB, 4096).iter().all(|&x| x == 0x11));
    let eperm = |r: io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EPERM);
    assert!(eperm(sb.write(0, 1, 4096, false)));
    assert!(eperm(sb.run(BlockRequest::Flush)));
    let e = b.activate().unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert!(!b.is_active());

    a.inactivate().unwrap();
    a.inactivate().unwrap();
    assert!(a.rbd_lock().is_none());
    assert!(eperm(sa.write(0, 1, 4096, false)));
    b.activate().unwrap();
    assert_eq!(b.rbd_lock(), Some(aio_rbd::LockTaken::Acquired));
    sb.write(2 * MIB, 0x22, 4096, true).unwrap();
    assert!(sa.read(2 * MIB, 4096).iter().all(|&x| x == 0x22));
    assert!(a.activate().unwrap_err().is_conflict());
    assert!(!a.is_active());
}

/// A qcow2 image in RBD handed over: B activated reads the cluster A allocated after B
/// opened (its metadata read afresh), and the image exported passes `qemu-img check`.
#[test]
fn a_qcow2_image_in_rbd_is_handed_over_and_read_afresh() {
    let Some(test) = TestCluster::get() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = ImageSpec::new("rbd", &TestCluster::unique_name("qhandover"));
    test.import_new_qcow2(&spec, "64M");
    let at = target(&test, &spec);
    let a = Arc::new(Image::open_rbd(&at, ImageOptions::default(), None).unwrap());
    let sa = Session::new(&a);
    sa.write(0, 0x11, 64 << 10, false).unwrap();
    let b = Arc::new(Image::open_rbd_inactive(&at, ImageOptions::default(), None).unwrap());
    assert_eq!(b.format_name(), "qcow2");
    let sb = Session::new(&b);
    assert!(sb.read(0, 64 << 10).iter().all(|&x| x == 0x11));
    sa.write(8 * MIB, 0x33, 64 << 10, false).unwrap();
    assert!(b.activate().unwrap_err().is_conflict());

    a.inactivate().unwrap();
    b.activate().unwrap();
    assert!(sb.read(8 * MIB, 64 << 10).iter().all(|&x| x == 0x33));
    sb.write(16 * MIB, 0x44, 64 << 10, true).unwrap();
    drop((sa, sb, a));
    b.close().unwrap();
    drop(b);
    let back = dir.path().join("out.qcow2");
    test.rbd(&["export", &spec.to_string(), back.to_str().unwrap()]);
    let out = std::process::Command::new("qemu-img")
        .args(["check", back.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let read = std::process::Command::new("qemu-io")
        .args([
            "-r",
            "-c",
            "read -P 0x33 8M 64k",
            "-c",
            "read -P 0x44 16M 64k",
        ])
        .arg(&back)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&read.stdout);
    assert!(
        read.status.success() && !text.contains("verification failed"),
        "{text}"
    );
}
