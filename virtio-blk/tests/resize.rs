//! A disk resized while a queue serves it (QEMU's `block_resize`): requests past the old end
//! are refused before and served after a grow, refused again after a shrink; a qcow2 image
//! grown and shrunk stays clean for `qemu-img check` and keeps what was written.
//!
//! Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`; `.ci/run` installs it).

mod common;
#[path = "common/ops.rs"]
mod ops;

use std::sync::Arc;

use aio::EngineKind;
use aio_virtio_blk::device::{BlockDevice, DiskOptions, ResizeError};
use aio_virtio_blk::format::ImageFormat;
use aio_virtio_blk::spec;
use ops::{new_qcow2, options, qemu, read, serve, write};

const MIB: u64 = 1 << 20;

/// A directory with `disk.qcow2`, a new 16 MiB qcow2 image made by `qemu-img`.
fn qcow2_16m() -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, _) = new_qcow2("disk.qcow2", "16M");
    let at = dir.path().to_path_buf();
    (dir, at)
}

/// A raw file grown and shrunk under a served queue: the queue checks each request against
/// the size of the moment.
#[test]
fn a_served_raw_disk_takes_requests_up_to_its_new_end() {
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let path = dir.path().join("disk.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(4 * MIB))
        .unwrap();
    let raw = DiskOptions {
        format: ImageFormat::Raw,
        ..DiskOptions::default()
    };
    let device = Arc::new(BlockDevice::open(&path, raw).unwrap());
    let engine = EngineKind::Pool.build(&options()).unwrap();
    let disk = device.clone();
    serve(engine, device, move |d| {
        let end = 8 * MIB - 4096;
        assert_eq!(write(d, end, &[0x5a; 4096]), spec::S_IOERR, "past the end");
        disk.resize(8 * MIB).unwrap();
        assert_eq!(write(d, end, &[0x5a; 4096]), spec::S_OK, "the new end");
        let (status, data) = read(d, end, 4096);
        assert_eq!(status, spec::S_OK);
        assert!(data.iter().all(|&b| b == 0x5a));
        // The new sectors before it read zeros.
        let (status, data) = read(d, 4 * MIB, 4096);
        assert_eq!(status, spec::S_OK);
        assert!(data.iter().all(|&b| b == 0));
        disk.resize(2 * MIB).unwrap();
        assert_eq!(read(d, 2 * MIB, 4096).0, spec::S_IOERR, "shrunk");
        assert_eq!(read(d, 2 * MIB - 4096, 4096).0, spec::S_OK);
    });
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * MIB);
}

/// A qcow2 image grown while served, written at its new end, then shrunk: `qemu-img` sees
/// each size, the data and a clean image.
#[test]
fn a_served_qcow2_image_grows_and_shrinks_and_stays_clean() {
    let (_dir, at) = qcow2_16m();
    let at = at.as_path();
    let path = at.join("disk.qcow2");
    let device = Arc::new(BlockDevice::open(&path, DiskOptions::default()).unwrap());
    let engine = EngineKind::Pool.build(&options()).unwrap();
    let disk = device.clone();
    serve(engine, device, move |d| {
        assert_eq!(write(d, 60 * MIB, &[0x33; 65536]), spec::S_IOERR);
        disk.resize(64 * MIB).unwrap();
        assert_eq!(write(d, 60 * MIB, &[0x33; 65536]), spec::S_OK);
        assert_eq!(write(d, 4 * MIB, &[0x44; 65536]), spec::S_OK);
        let (status, data) = read(d, 60 * MIB, 65536);
        assert_eq!(status, spec::S_OK);
        assert!(data.iter().all(|&b| b == 0x33));
    });
    let info = qemu(at, "qemu-img", &["info", "disk.qcow2"]);
    assert!(info.contains("virtual size: 64 MiB"), "{info}");
    let check = qemu(at, "qemu-img", &["check", "disk.qcow2"]);
    assert!(check.contains("No errors were found"), "{check}");
    let read_at = |offset: u64, byte: u8| {
        let cmd = format!("read -P {byte:#x} {offset} 65536");
        let out = qemu(
            at,
            "qemu-io",
            &["-f", "qcow2", "-r", "-c", &cmd, "disk.qcow2"],
        );
        assert!(!out.contains("verification failed"), "{out}");
    };
    read_at(60 * MIB, 0x33);

    let device = BlockDevice::open(&path, DiskOptions::default()).unwrap();
    assert_eq!(device.capacity_sectors(), 64 * MIB / 512);
    device.resize(8 * MIB).unwrap();
    assert_eq!(device.capacity_sectors(), 8 * MIB / 512);
    drop(device);
    let info = qemu(at, "qemu-img", &["info", "disk.qcow2"]);
    assert!(info.contains("virtual size: 8 MiB"), "{info}");
    let check = qemu(at, "qemu-img", &["check", "disk.qcow2"]);
    assert!(check.contains("No errors were found"), "{check}");
    read_at(4 * MIB, 0x44);
}

/// A read-only qcow2 image is not resized, and says why.
#[test]
fn a_read_only_image_is_not_resized() {
    let (_dir, at) = qcow2_16m();
    let at = at.as_path();
    let ro = DiskOptions {
        read_only: true,
        ..DiskOptions::default()
    };
    let device = BlockDevice::open(&at.join("disk.qcow2"), ro).unwrap();
    let e = device.resize(32 * MIB).unwrap_err();
    assert!(matches!(e, ResizeError::ReadOnly), "{e}");
    assert_eq!(device.capacity_sectors(), 16 * MIB / 512);
}
