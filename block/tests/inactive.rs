//! Inactive images with QEMU 10.0's semantics, two users of one image in this process (each
//! its own open file description, as two processes would be): the active one serves, the
//! inactive one reads and refuses every other request with `EPERM`; inactivating one hands
//! the image's locks to the other, whose activation reads what was written meanwhile. Raw
//! files and qcow2 images (checked by `qemu-img` afterwards, their persistent bitmaps kept).

mod common;

use std::path::Path;
use std::sync::Arc;

use aio_block::format::ImageFormat;
use aio_block::image::ActivationError;
use aio_block::lock::LockError;
use aio_block::{BlockRequest, Image, ImageOptions};
use common::session::{errno, Session};

const MIB: u64 = 1 << 20;

/// The dirty ranges of `image`'s bitmap `name`.
fn dirty(image: &Image, name: &str) -> Vec<(u64, u64)> {
    common::bitmaps::dirty(&image.dirty_bitmaps().get(name).expect("the bitmap"))
}

/// One user of the image: it and its session.
fn user(image: Image) -> (Arc<Image>, Session) {
    let image = Arc::new(image);
    let (_, engine) = common::engines().remove(0);
    let session = Session::new(&image, engine);
    (image, session)
}

/// Every request but a read is refused with `EPERM`; a read is served.
fn only_reads(s: &Session) {
    assert_eq!(errno(s.write(0, &[1; 4096], false)), Some(libc::EPERM));
    assert_eq!(errno(s.write(0, &[1; 4096], true)), Some(libc::EPERM));
    assert_eq!(errno(s.run(BlockRequest::Flush)), Some(libc::EPERM));
    let discard = BlockRequest::Discard {
        offset: 0,
        len: 4096,
    };
    assert_eq!(errno(s.run(discard)), Some(libc::EPERM));
    for unmap in [false, true] {
        let zeroes = BlockRequest::WriteZeroes {
            offset: 0,
            len: 4096,
            unmap,
        };
        assert_eq!(errno(s.run(zeroes)), Some(libc::EPERM));
    }
    s.read(0, 4096).0.unwrap();
}

/// `len` bytes at `offset` as the session reads them.
fn reads(s: &Session, offset: u64, len: usize) -> Vec<u8> {
    let (r, data) = s.read(offset, len);
    r.unwrap();
    data
}

fn conflict(e: &ActivationError) -> bool {
    matches!(e, ActivationError::Lock(LockError::Conflict { .. })) && e.is_conflict()
}

/// The hand-over of a raw file: B reads A's writes while inactive, takes the lock once A has
/// let it go, and then A is the one refused.
#[test]
fn a_raw_image_is_handed_over_between_two_users() {
    let dir = aio_test_support::images::image_dir("inactive");
    let path = aio_test_support::images::raw_image(dir.path(), "disk.img", 4 * MIB, 0, 0);
    let options = ImageOptions::new(ImageFormat::Raw);
    let (a, sa) = user(Image::open(&path, options.clone()).unwrap());
    let (b, sb) = user(Image::open_inactive(&path, options).unwrap());
    assert!(a.is_active() && !b.is_active());
    sa.write(MIB, &[0x41; 4096], false).unwrap();
    assert!(reads(&sb, MIB, 4096).iter().all(|&x| x == 0x41));
    only_reads(&sb);
    assert!(matches!(
        b.resize(8 * MIB),
        Err(aio_block::image::ResizeError::Inactive)
    ));
    // A holds the lock: B stays inactive, and still reads.
    let e = b.activate().unwrap_err();
    assert!(conflict(&e), "{e}");
    assert!(!b.is_active());
    assert!(reads(&sb, MIB, 4096).iter().all(|&x| x == 0x41));

    a.inactivate().unwrap();
    a.inactivate().unwrap();
    only_reads(&sa);
    b.activate().unwrap();
    sb.write(2 * MIB, &[0x42; 4096], true).unwrap();
    sb.run(BlockRequest::Flush).unwrap();
    assert!(reads(&sa, 2 * MIB, 4096).iter().all(|&x| x == 0x42));
    assert!(conflict(&a.activate().unwrap_err()));
    assert!(!a.is_active());
    only_reads(&sa);
    // QEMU's tools see B's lock.
    let out = aio_test_support::tool::output(
        "qemu-io",
        &["-f", "raw", "-c", "write 0 4k", path.to_str().unwrap()],
    );
    assert!(!out.status.success(), "B holds the write lock");
}

fn qemu_img(dir: &Path, args: &[&str]) -> String {
    common::run_in(dir, "qemu-img", args)
}

/// The hand-over of a qcow2 image: B, opened inactive (read-only, unlocked) after A wrote,
/// reads that; A allocates a new cluster after B opened; B, activated once A has written its
/// metadata back and let go, reads it (its metadata read afresh) and allocates its own; and
/// the image passes `qemu-img check` with its persistent bitmap still listed. The bitmap goes
/// with the image, as QEMU hands it over: each inactivation stores it, each activation loads
/// it, so it ends consistent with every user's writes dirty.
#[test]
fn a_qcow2_image_is_handed_over_and_its_metadata_read_afresh() {
    let dir = aio_test_support::images::image_dir("inactive");
    let path = aio_test_support::images::qcow2_image(dir.path(), "disk.qcow2", "64M");
    qemu_img(dir.path(), &["bitmap", "--add", "disk.qcow2", "ck1"]);
    let options = ImageOptions::new(ImageFormat::Qcow2);
    let (a, sa) = user(Image::open(&path, options.clone()).unwrap());
    // A keeps ck1 consistent on disk while it writes (crash-consistent bitmaps).
    assert!(a.bitmaps_marked_inconsistent().is_empty());
    sa.write(MIB, &[0x41; 65536], false).unwrap();
    let (b, sb) = user(Image::open_inactive(&path, options).unwrap());
    assert!(!b.is_active());
    assert!(
        b.bitmaps_marked_inconsistent().is_empty(),
        "nothing written"
    );
    assert!(reads(&sb, MIB, 65536).iter().all(|&x| x == 0x41));
    // A new cluster, after B read the metadata (B may read it stale: QEMU allows it).
    sa.write(8 * MIB, &[0x43; 65536], false).unwrap();
    sb.read(8 * MIB, 65536).0.unwrap();
    only_reads(&sb);
    let e = b.activate().unwrap_err();
    assert!(conflict(&e), "{e}");
    assert!(!b.is_active());
    sb.read(MIB, 4096).0.unwrap();

    a.inactivate().unwrap();
    a.inactivate().unwrap();
    only_reads(&sa);
    b.activate().unwrap();
    assert!(
        reads(&sb, 8 * MIB, 65536).iter().all(|&x| x == 0x43),
        "B reads what A allocated after B opened"
    );
    assert!(reads(&sb, MIB, 65536).iter().all(|&x| x == 0x41));
    // A stored ck1 at its inactivation and dropped it; B loaded it with A's writes.
    assert!(a.dirty_bitmaps().get("ck1").is_none(), "A let ck1 go");
    assert!(b.bitmaps_marked_inconsistent().is_empty());
    assert_eq!(dirty(&b, "ck1"), [(MIB, 65536), (8 * MIB, 65536)]);
    sb.write(16 * MIB, &[0x44; 65536], false).unwrap();
    sb.run(BlockRequest::Flush).unwrap();
    assert!(conflict(&a.activate().unwrap_err()));
    only_reads(&sa);

    // Back to A: it reads B's cluster.
    b.inactivate().unwrap();
    a.activate().unwrap();
    assert!(reads(&sa, 16 * MIB, 65536).iter().all(|&x| x == 0x44));
    sa.write(24 * MIB, &[0x45; 65536], false).unwrap();
    assert_eq!(
        dirty(&a, "ck1"),
        [
            (MIB, 65536),
            (8 * MIB, 65536),
            (16 * MIB, 65536),
            (24 * MIB, 65536)
        ],
        "A loaded ck1 with B's write"
    );
    drop((sa, sb, a, b));

    let check = qemu_img(dir.path(), &["check", "disk.qcow2"]);
    assert!(check.contains("No errors were found"), "{check}");
    assert!(!check.contains("leaked"), "{check}");
    let info = qemu_img(dir.path(), &["info", "--output=json", "disk.qcow2"]);
    assert!(
        info.contains("\"ck1\"") && !info.contains("in-use"),
        "{info}"
    );
    let reopened =
        Image::open(&path, ImageOptions::new(ImageFormat::Qcow2).read_only(true)).unwrap();
    assert_eq!(
        dirty(&reopened, "ck1").len(),
        4,
        "stored with every user's writes"
    );
    for (pattern, offset) in [
        (0x41, MIB),
        (0x43, 8 * MIB),
        (0x44, 16 * MIB),
        (0x45, 24 * MIB),
    ] {
        let cmd = format!("read -P {pattern:#x} {offset} 64k");
        let out = common::run_in(
            dir.path(),
            "qemu-io",
            &["-f", "qcow2", "-r", "-c", &cmd, "disk.qcow2"],
        );
        assert!(!out.contains("Pattern verification failed"), "{cmd}: {out}");
    }
}

/// Inactivating waits for nothing: a qcow2 image with a request holding it refuses, and
/// stays active.
#[test]
fn a_qcow2_image_with_requests_in_flight_is_not_inactivated() {
    let dir = aio_test_support::images::image_dir("inactive");
    let path = aio_test_support::images::qcow2_image(dir.path(), "disk.qcow2", "64M");
    let (a, sa) = user(Image::open(&path, ImageOptions::new(ImageFormat::Qcow2)).unwrap());
    // A write that allocates is a task: submitted, not yet run.
    let (buffers, _) =
        aio_block::LentMemory::from_aligned(aio_core::engine::AlignedBuf::from_slice(&[7; 4096]));
    sa.queue.plug();
    sa.queue.submit(
        &sa.ctx,
        &sa.ends,
        BlockRequest::Write {
            offset: 0,
            buffers,
            fua: false,
        },
        99,
    );
    sa.queue.unplug(&sa.ctx);
    // Its data write is with the engine, whose completion only the loop delivers.
    assert!(sa.ends.done.borrow().is_empty());
    let e = a.inactivate().unwrap_err();
    assert!(matches!(e, ActivationError::InFlight { .. }), "{e}");
    assert!(a.is_active());
    while sa.ends.done.borrow().is_empty() {
        sa.ctx.poll(true);
    }
    assert!(sa.ends.done.borrow()[0].1.is_ok());
    a.inactivate().unwrap();
    assert!(!a.is_active());
}
