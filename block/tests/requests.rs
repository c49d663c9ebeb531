//! The block layer's request path with no export in sight: raw, qcow2 and null images read,
//! written (FUA too), flushed, discarded and zeroed through an `ImageQueue` on every engine
//! this machine has, the results checked against the files (and `qemu-img` for qcow2), and
//! every refusal an answer with the image untouched.

mod common;

use std::cell::UnsafeCell;
use std::sync::Arc;

use aio_block::format::ImageFormat;
use aio_block::{BlockRequest, Image, ImageOptions, LentMemory};
use aio_core::engine::AlignedBuf;
use common::session::{errno, taken, Session};

#[cfg(feature = "qcow2")]
fn qemu_img(dir: &std::path::Path, args: &[&str]) -> String {
    common::run_in(dir, "qemu-img", args)
}

const MIB: u64 = 1 << 20;

/// The ops every kind of image serves, checked through the session itself.
fn exercise(s: &Session, name: &str) {
    let a = vec![0x61u8; 64 << 10];
    s.write(MIB, &a, false).unwrap();
    s.write(MIB + 4096, &[0x62; 8192], true).unwrap();
    let (r, data) = s.read(MIB, 64 << 10);
    r.unwrap();
    assert!(data[..4096].iter().all(|&b| b == 0x61), "{name}");
    assert!(data[4096..12288].iter().all(|&b| b == 0x62), "{name}");
    assert!(data[12288..].iter().all(|&b| b == 0x61), "{name}");
    s.run(BlockRequest::Flush).unwrap();
    for unmap in [false, true] {
        let zeroes = BlockRequest::WriteZeroes {
            offset: MIB,
            len: 16384,
            unmap,
        };
        s.run(zeroes).unwrap();
        let (r, data) = s.read(MIB, 16384);
        r.unwrap();
        assert!(
            data.iter().all(|&b| b == 0),
            "{name}: write-zeroes unmap={unmap}"
        );
        s.write(MIB, &[0x63; 16384], false).unwrap();
    }
    let discard = BlockRequest::Discard {
        offset: 2 * MIB,
        len: 64 << 10,
    };
    s.run(discard).unwrap();
    // Past the end, and of no length: refused, nothing written.
    let size = s.queue.image().size();
    assert_eq!(
        errno(s.write(size - 4096, &[1; 8192], false)),
        Some(libc::EINVAL)
    );
    let empty = BlockRequest::Discard { offset: 0, len: 0 };
    assert_eq!(errno(s.run(empty)), Some(libc::EINVAL), "{name}");
    let (r, _) = s.read(size, 4096);
    assert_eq!(errno(r), Some(libc::EINVAL), "{name}");
}

#[test]
fn a_raw_image_serves_every_op_on_every_engine_straight_to_its_file() {
    for (kind, engine) in common::engines() {
        let dir = aio_test_support::images::image_dir("block-test");
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0u8; 4 << 20]).unwrap();
        let image = Arc::new(Image::open(&path, ImageOptions::new(ImageFormat::Raw)).unwrap());
        let s = Session::new(&image, engine);
        exercise(&s, &kind.to_string());
        drop(s);
        drop(image);
        let file = std::fs::read(&path).unwrap();
        let at = MIB as usize;
        assert!(file[at..at + 16384].iter().all(|&b| b == 0x63), "{kind}");
        assert!(
            file[at + 16384..at + 65536].iter().all(|&b| b == 0x61),
            "{kind}"
        );
        assert_eq!(file.len(), 4 << 20, "{kind}: nothing past the end");
    }
}

#[cfg(feature = "qcow2")]
#[test]
fn a_qcow2_image_serves_every_op_and_qemu_reads_back_what_was_written() {
    for (kind, engine) in common::engines() {
        let dir = aio_test_support::images::image_dir("block-test");
        qemu_img(
            dir.path(),
            &["create", "-q", "-f", "qcow2", "disk.qcow2", "4M"],
        );
        let path = dir.path().join("disk.qcow2");
        let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
        assert_eq!(image.format_name(), "qcow2");
        let s = Session::new(&image, engine);
        exercise(&s, &kind.to_string());
        // Into clusters the image owns now: the direct path, the same data.
        s.write(MIB + 8192, &[0x64; 4096], false).unwrap();
        let (r, data) = s.read(MIB + 8192, 4096);
        r.unwrap();
        assert!(data.iter().all(|&b| b == 0x64), "{kind}");
        drop(s);
        image.close().unwrap();
        drop(image);
        let check = qemu_img(dir.path(), &["check", "disk.qcow2"]);
        assert!(check.contains("No errors were found"), "{kind}: {check}");
        qemu_img(
            dir.path(),
            &["convert", "-O", "raw", "disk.qcow2", "out.raw"],
        );
        let file = std::fs::read(dir.path().join("out.raw")).unwrap();
        let at = MIB as usize;
        assert!(file[at..at + 8192].iter().all(|&b| b == 0x63), "{kind}");
        assert!(
            file[at + 8192..at + 12288].iter().all(|&b| b == 0x64),
            "{kind}"
        );
        assert!(
            file[at + 12288..at + 16384].iter().all(|&b| b == 0x63),
            "{kind}"
        );
        assert!(
            file[at + 16384..at + 65536].iter().all(|&b| b == 0x61),
            "{kind}"
        );
    }
}

#[test]
fn the_null_image_reads_zeros_and_keeps_nothing() {
    let image = Arc::new(Image::null(4 * MIB, ImageOptions::default()).unwrap());
    let (kind, engine) = common::engines().remove(0);
    let s = Session::new(&image, engine);
    s.write(0, &[7; 4096], true).unwrap();
    let (r, data) = s.read(0, 4096);
    r.unwrap();
    assert!(data.iter().all(|&b| b == 0), "{kind}: read-zeroes");
}

/// Memory whose address is not aligned for `O_DIRECT` (a test's own hold).
struct Unaligned(UnsafeCell<AlignedBuf>);
// SAFETY: the buffer is reached only through one request's iovecs at a time, and read by
// the test only once that request has ended.
unsafe impl Sync for Unaligned {}

#[test]
fn misaligned_memory_goes_through_a_bounce_buffer_with_the_same_data() {
    let dir = aio_test_support::images::image_dir("block-test");
    let path = dir.path().join("disk.img");
    std::fs::write(&path, vec![0x5au8; MIB as usize]).unwrap();
    let image = Arc::new(Image::open(&path, ImageOptions::new(ImageFormat::Raw)).unwrap());
    let (kind, engine) = common::engines().remove(0);
    let s = Session::new(&image, engine);
    let cell = Arc::new(Unaligned(UnsafeCell::new(AlignedBuf::new(8192))));
    // SAFETY: the test holds no reference into the buffer while the request runs.
    let base = unsafe { (*cell.0.get()).as_mut_ptr() }.wrapping_add(1);
    // SAFETY: 4096 bytes from `base` lie inside the buffer, which `cell` keeps alive; nothing
    // else touches them until the request has ended.
    let buffers = unsafe { LentMemory::new([(base, 4096)], Some(cell.clone())) };
    s.run(BlockRequest::Read {
        offset: 4096,
        buffers,
    })
    .unwrap();
    assert_eq!(s.ends.bounced.get(), 1, "{kind}");
    let cell = Arc::try_unwrap(cell).ok().expect("no hold after the end");
    let buf = cell.0.into_inner();
    assert!(buf[1..4097].iter().all(|&b| b == 0x5a), "{kind}");
    assert_eq!(
        (buf[0], buf[4097]),
        (0, 0),
        "{kind}: nothing outside the segment"
    );
}

#[test]
fn refusals_leave_the_image_untouched() {
    let dir = aio_test_support::images::image_dir("block-test");
    let path = dir.path().join("disk.img");
    std::fs::write(&path, vec![0u8; MIB as usize]).unwrap();
    let (_, engine) = common::engines().remove(0);
    // A probed raw image: a qcow2 header into sector 0 is refused (QEMU's raw driver).
    let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
    let s = Session::new(&image, engine);
    let mut head = vec![0u8; 4096];
    head[..4].copy_from_slice(b"QFI\xfb");
    assert_eq!(errno(s.write(0, &head, false)), Some(libc::EPERM));
    s.write(512, &head, false).unwrap();
    drop((s, image));
    // Read-only: every change refused.
    let (_, engine) = common::engines().remove(0);
    let options = ImageOptions::new(ImageFormat::Raw).read_only(true);
    let image = Arc::new(Image::open(&path, options).unwrap());
    let s = Session::new(&image, engine);
    assert_eq!(errno(s.write(0, &[1; 512], false)), Some(libc::EPERM));
    let zeroes = BlockRequest::WriteZeroes {
        offset: 0,
        len: 4096,
        unmap: true,
    };
    assert_eq!(errno(s.run(zeroes)), Some(libc::EPERM));
    s.read(0, 4096).0.unwrap();
    drop((s, image));
    // Inactive (an upgrade's handoff, a migration's destination): reads only, until it
    // holds its locks.
    let (_, engine) = common::engines().remove(0);
    let image = Arc::new(Image::open_inactive(&path, ImageOptions::new(ImageFormat::Raw)).unwrap());
    let s = Session::new(&image, engine);
    s.read(0, 4096).0.unwrap();
    assert_eq!(errno(s.write(0, &[1; 512], false)), Some(libc::EPERM));
    assert_eq!(errno(s.run(BlockRequest::Flush)), Some(libc::EPERM));
    image.activate().unwrap();
    s.read(0, 4096).0.unwrap();
    let file = std::fs::read(&path).unwrap();
    assert!(file[..512].iter().all(|&b| b == 0));
    assert_eq!(&file[512..516], b"QFI\xfb");
}

/// Memory the test lends without a hold, `len` bytes of `buf` from `at`.
fn unheld(buf: &mut AlignedBuf, at: usize, len: usize) -> LentMemory {
    assert!(at + len <= buf.len());
    // SAFETY: the segment lies inside `buf`, which the test keeps alive and untouched until
    // the request it goes to has ended (`Session::run` returns only then).
    unsafe { LentMemory::new([(buf.as_mut_ptr().wrapping_add(at), len)], None) }
}

#[test]
fn memory_lent_without_a_hold_is_served_by_every_image_kind() {
    let dir = aio_test_support::images::image_dir("block-test");
    let raw = dir.path().join("disk.img");
    std::fs::write(&raw, vec![0u8; MIB as usize]).unwrap();
    #[cfg_attr(not(feature = "qcow2"), allow(unused_mut))]
    let mut paths = vec![(raw, ImageFormat::Raw)];
    #[cfg(feature = "qcow2")]
    {
        qemu_img(
            dir.path(),
            &["create", "-q", "-f", "qcow2", "disk.qcow2", "1M"],
        );
        paths.push((dir.path().join("disk.qcow2"), ImageFormat::Qcow2));
    }
    for (path, format) in paths {
        let image = Arc::new(Image::open(&path, ImageOptions::new(format)).unwrap());
        let (kind, engine) = common::engines().remove(0);
        let s = Session::new(&image, engine);
        let mut buf = AlignedBuf::from_slice(&[0x3c; 8192]);
        // Twice: a qcow2 image's first write allocates (its storage path, which copies memory
        // lent without a hold), the second finds its clusters (the direct path).
        for _ in 0..2 {
            let buffers = unheld(&mut buf, 0, 8192);
            let write = BlockRequest::Write {
                offset: 65536,
                buffers,
                fua: false,
            };
            s.run(write).unwrap();
        }
        buf.fill(0);
        let buffers = unheld(&mut buf, 4096, 4096);
        s.run(BlockRequest::Read {
            offset: 65536 + 4096,
            buffers,
        })
        .unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0), "{kind} {format:?}");
        assert!(buf[4096..].iter().all(|&b| b == 0x3c), "{kind} {format:?}");
        drop(s);
        image.close().unwrap();
    }
}

#[test]
#[allow(deprecated)]
fn the_old_names_are_the_one_type() {
    let (old, back): (aio_block::Buffers, _) = LentMemory::from_aligned(AlignedBuf::new(512));
    let old: aio_rbd::Memory = old;
    let old: aio_core::engine::GuestIovecs = old;
    drop::<aio_block::request::Buffers>(old);
    assert_eq!(taken(back).len(), 512, "dropped: the buffer comes back");
}
