//! Images other than a plain raw file, driven through the in-process split-ring driver: qcow2
//! images made by QEMU's `qemu-img` (with a backing chain) on every engine, checked afterwards
//! by `qemu-img check` and `qemu-io`; the images refused before opening; a probed raw image's
//! sector 0; the null device.
//!
//! Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`; `.ci/run` installs it).

mod common;
#[path = "common/ops.rs"]
mod ops;

use std::path::Path;
use std::sync::Arc;

use aio::{EngineKind, IoEngine};
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::format::ImageFormat;
use aio_virtio_blk::spec;
use ops::{new_qcow2, one, options, qemu, range_op, read, serve, write};

const MIB: u64 = 1 << 20;

/// Checks with `qemu-io` that `len` bytes at `offset` of `image` all hold `byte`.
fn assert_pattern(dir: &Path, image: &str, format: &str, offset: u64, len: u64, byte: u8) {
    let cmd = format!("read -P {byte:#x} {offset} {len}");
    let out = qemu(dir, "qemu-io", &["-f", format, "-r", "-c", &cmd, image]);
    assert!(
        !out.contains("Pattern verification failed") && out.contains("read "),
        "{image} at {offset}: {out}"
    );
}

/// The engines of this build that this kernel runs, each built once here (a refused one is a
/// reported skip): a ring built, dropped and built again can be refused under a small
/// `RLIMIT_MEMLOCK`, since the kernel frees the first one's locked memory later.
fn engines() -> Vec<(EngineKind, Box<dyn IoEngine>)> {
    aio_test_support::engines::engines()
}

#[test]
fn a_qcow2_overlay_serves_its_backing_file_and_keeps_the_guests_writes_on_every_engine() {
    for (kind, engine) in engines() {
        let dir = aio_test_support::images::image_dir("virtio-blk-test");
        let at = dir.path();
        qemu(
            at,
            "qemu-img",
            &["create", "-q", "-f", "qcow2", "base.qcow2", "16M"],
        );
        qemu(
            at,
            "qemu-io",
            &["-f", "qcow2", "-c", "write -P 0xb1 0 1M", "base.qcow2"],
        );
        // A relative backing name: resolved against the overlay's directory.
        let create = [
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            "base.qcow2",
        ];
        qemu(at, "qemu-img", &[&create[..], &["top.qcow2"]].concat());
        let device = BlockDevice::open(&at.join("top.qcow2"), DiskOptions::default()).unwrap();
        assert_eq!(device.format_name(), "qcow2");
        assert_eq!(device.capacity_sectors(), 16 * MIB / 512);
        assert_eq!(device.backing_chain(), [at.join("base.qcow2")]);
        assert!(device.file().is_none());

        serve(engine, Arc::new(device), |d| {
            // The backing file's data, through the overlay.
            let (status, data) = read(d, 0, 64 << 10);
            assert_eq!(status, spec::S_OK);
            assert!(data.iter().all(|&b| b == 0xb1), "backing data");
            // Allocating writes (a new cluster), then a write over part of a backing cluster.
            for i in 0..8u64 {
                let s = write(d, 4 * MIB + i * (64 << 10), &[0x5a; 64 << 10]);
                assert_eq!(s, spec::S_OK);
            }
            assert_eq!(write(d, 4096, &[0x77; 4096]), spec::S_OK);
            assert_eq!(one(d, spec::T_FLUSH, 0, 0), spec::S_OK);
            let (status, data) = read(d, 4 * MIB, 64 << 10);
            assert_eq!(status, spec::S_OK);
            assert!(data.iter().all(|&b| b == 0x5a));
            let (_, data) = read(d, 0, 3 * 4096);
            assert!(data[..4096].iter().all(|&b| b == 0xb1), "around the write");
            assert!(data[4096..8192].iter().all(|&b| b == 0x77), "the write");
            assert!(data[8192..].iter().all(|&b| b == 0xb1), "around the write");
            // Zeroes, unmapped and not, read back as zeros; a discard succeeds.
            for (offset, unmap) in [(5 * MIB, false), (6 * MIB, true)] {
                assert_eq!(write(d, offset, &[0x33; 64 << 10]), spec::S_OK);
                let s = range_op(d, spec::T_WRITE_ZEROES, offset, 64 << 10, unmap);
                assert_eq!(s, spec::S_OK, "write-zeroes unmap={unmap}");
                let (_, data) = read(d, offset, 64 << 10);
                assert!(data.iter().all(|&b| b == 0), "zeroes unmap={unmap}");
            }
            assert_eq!(
                range_op(d, spec::T_DISCARD, 8 * MIB, MIB, false),
                spec::S_OK
            );
            // Past the end: refused by the chain's checks, as for raw.
            assert_eq!(one(d, spec::T_IN, 16 * MIB / 512, 4096), spec::S_IOERR);
        });

        // Closed: QEMU's tools find the image consistent and the guest's data where it wrote.
        let check = qemu(at, "qemu-img", &["check", "top.qcow2"]);
        assert!(check.contains("No errors were found"), "{kind}: {check}");
        assert_pattern(at, "top.qcow2", "qcow2", 4 * MIB, 512 << 10, 0x5a);
        assert_pattern(at, "top.qcow2", "qcow2", 4096, 4096, 0x77);
        assert_pattern(at, "top.qcow2", "qcow2", 8192, MIB - 8192, 0xb1);
        assert_pattern(at, "top.qcow2", "qcow2", 5 * MIB, 64 << 10, 0);
        // The backing file is untouched.
        assert_pattern(at, "base.qcow2", "qcow2", 0, MIB, 0xb1);
        assert_pattern(at, "base.qcow2", "qcow2", 4 * MIB, MIB, 0);
        println!("{kind}: qcow2 overlay served and checked");
    }
}

/// Two iothreads (each its own context, engine and queue, each driven by its own guest
/// thread) allocate interleaved clusters of one qcow2 image at once: imago's locks are taken
/// and released across threads, and every cluster ends up with its writer's data.
#[test]
fn one_qcow2_image_is_served_by_queues_on_two_iothreads_at_once() {
    const CLUSTER: u64 = 64 << 10;
    const PER_THREAD: u64 = 48;
    let (dir, path) = new_qcow2("img.qcow2", "64M");
    let at = dir.path();
    let device = Arc::new(BlockDevice::open(&path, DiskOptions::default()).unwrap());
    let iothreads: Vec<_> = (0..2u64)
        .map(|t| {
            let device = device.clone();
            std::thread::spawn(move || {
                let engine = EngineKind::Pool.build(&options()).unwrap();
                serve(engine, device, move |d| {
                    let byte = 0x10 + t as u8;
                    for i in 0..PER_THREAD {
                        let offset = (2 * i + t) * CLUSTER;
                        assert_eq!(write(d, offset, &[byte; CLUSTER as usize]), spec::S_OK);
                    }
                    for i in 0..PER_THREAD {
                        let (status, data) = read(d, (2 * i + t) * CLUSTER, CLUSTER as usize);
                        assert_eq!(status, spec::S_OK);
                        assert!(data.iter().all(|&b| b == byte), "thread {t} cluster {i}");
                    }
                })
            })
        })
        .collect();
    for t in iothreads {
        t.join().unwrap();
    }
    device.close().unwrap();
    drop(device);
    let check = qemu(at, "qemu-img", &["check", "img.qcow2"]);
    assert!(check.contains("No errors were found"), "{check}");
    let mut args = vec!["-f".to_string(), "qcow2".into(), "-r".into()];
    for c in 0..2 * PER_THREAD {
        let byte = 0x10 + c % 2;
        args.push("-c".into());
        args.push(format!("read -P {byte:#x} {} {CLUSTER}", c * CLUSTER));
    }
    args.push("img.qcow2".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = qemu(at, "qemu-io", &args);
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

/// Images as QEMU's tools make them: cluster sizes 4 KiB to 2 MiB, version 2 (`compat=0.10`),
/// `lazy_refcounts`, metadata preallocated, and compressed clusters (`qemu-img convert -c`).
/// Each reads back what `qemu-io` wrote, takes the guest's writes, and is left clean.
#[test]
fn images_made_by_qemu_img_read_back_qemus_data_and_take_the_guests() {
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let at = dir.path();
    // A raw file holding QEMU's pattern, to convert (compressed) into qcow2.
    qemu(
        at,
        "qemu-img",
        &["create", "-q", "-f", "raw", "src.raw", "16M"],
    );
    qemu(
        at,
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x61 1M 256k", "src.raw"],
    );
    let cases: [(&str, &[&str]); 7] = [
        ("c4k", &["-o", "cluster_size=4k"]),
        ("c64k", &[]),
        ("c2m", &["-o", "cluster_size=2M"]),
        ("v2", &["-o", "compat=0.10"]),
        ("lazy", &["-o", "lazy_refcounts=on"]),
        ("prealloc", &["-o", "preallocation=metadata"]),
        ("compressed", &[]),
    ];
    for (name, opts) in cases {
        let image = format!("{name}.qcow2");
        if name == "compressed" {
            qemu(
                at,
                "qemu-img",
                &[
                    "convert", "-c", "-f", "raw", "-O", "qcow2", "src.raw", &image,
                ],
            );
        } else {
            let create = [&["create", "-q", "-f", "qcow2"][..], opts, &[&image, "16M"]].concat();
            qemu(at, "qemu-img", &create);
            qemu(
                at,
                "qemu-io",
                &["-f", "qcow2", "-c", "write -P 0x61 1M 256k", &image],
            );
        }
        let device = BlockDevice::open(&at.join(&image), DiskOptions::default()).unwrap();
        assert_eq!(device.capacity_sectors(), 16 * MIB / 512, "{name}");
        let engine = EngineKind::Pool.build(&options()).unwrap();
        serve(engine, Arc::new(device), move |d| {
            let (status, data) = read(d, MIB, 64 << 10);
            assert_eq!(status, spec::S_OK, "{name}");
            assert!(data.iter().all(|&b| b == 0x61), "{name}: QEMU's data");
            // Over QEMU's data (a compressed cluster is rewritten), and fresh clusters.
            for offset in [MIB + 4096, 8 * MIB, 12 * MIB + 512 * 7] {
                assert_eq!(write(d, offset, &[0x62; 8192]), spec::S_OK, "{name}");
            }
            assert_eq!(one(d, spec::T_FLUSH, 0, 0), spec::S_OK);
        });
        let check = qemu(at, "qemu-img", &["check", &image]);
        assert!(check.contains("No errors were found"), "{name}: {check}");
        assert_pattern(at, &image, "qcow2", MIB, 4096, 0x61);
        assert_pattern(at, &image, "qcow2", MIB + 4096, 8192, 0x62);
        assert_pattern(at, &image, "qcow2", MIB + 12288, (256 << 10) - 12288, 0x61);
        assert_pattern(at, &image, "qcow2", 8 * MIB, 8192, 0x62);
        assert_pattern(at, &image, "qcow2", 12 * MIB + 512 * 7, 8192, 0x62);
    }
}

#[test]
fn a_probed_raw_image_refuses_a_format_header_in_sector_0_unless_said_raw() {
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let path = dir.path().join("disk.img");
    std::fs::File::create(&path).unwrap().set_len(MIB).unwrap();
    let mut header = [0u8; 4096];
    header[..8].copy_from_slice(b"QFI\xfb\0\0\0\x03");
    for (format, want) in [
        (ImageFormat::Auto, spec::S_IOERR),
        (ImageFormat::Raw, spec::S_OK),
    ] {
        let disk = DiskOptions {
            format,
            ..DiskOptions::default()
        };
        let device = BlockDevice::open(&path, disk).unwrap();
        let engine = EngineKind::Pool.build(&options()).unwrap();
        serve(engine, Arc::new(device), move |d| {
            assert_eq!(write(d, 0, &header), want, "{format:?}");
            // Anything else in sector 0, and the magic anywhere else, is written.
            assert_eq!(write(d, 4096, &header), spec::S_OK);
        });
        // Refused: the image still probes as raw.
        let first = std::fs::read(&path).unwrap();
        assert_eq!(&first[..4] == b"QFI\xfb", want == spec::S_OK, "{format:?}");
    }
}

#[test]
fn the_null_device_reads_zeros_and_drops_writes() {
    let device = BlockDevice::null(64 * MIB, DiskOptions::default()).unwrap();
    assert_eq!(device.capacity_sectors(), 64 * MIB / 512);
    assert_eq!(device.format_name(), "null");
    assert!(BlockDevice::null(1000, DiskOptions::default()).is_err());
    let engine = EngineKind::Pool.build(&options()).unwrap();
    serve(engine, Arc::new(device), |d| {
        assert_eq!(write(d, 0, &[0xee; 4096]), spec::S_OK);
        d.write_data(0, &[0xff; 4096]).unwrap();
        let (status, data) = read(d, 0, 4096);
        assert_eq!(status, spec::S_OK);
        assert!(data.iter().all(|&b| b == 0));
        assert_eq!(one(d, spec::T_FLUSH, 0, 0), spec::S_OK);
        assert_eq!(range_op(d, spec::T_DISCARD, 0, MIB, false), spec::S_OK);
        assert_eq!(range_op(d, spec::T_WRITE_ZEROES, 0, MIB, true), spec::S_OK);
        assert_eq!(one(d, spec::T_IN, 64 * MIB / 512, 4096), spec::S_IOERR);
    });
}

/// A cluster allocated for a small write reads as zeros around it, whether it lies past the
/// file's end (where the zeroing is skipped: a regular file reads zeros there) or is a freed
/// cluster inside the file that held the guest's old data (where it must be zeroed).
#[test]
fn a_small_write_into_a_new_cluster_reads_zeros_around_it_even_in_a_reused_cluster() {
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let at = dir.path();
    qemu(
        at,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "disk.qcow2", "64M"],
    );
    let device = BlockDevice::open(&at.join("disk.qcow2"), DiskOptions::default()).unwrap();
    let engine = EngineKind::Pool.build(&options()).unwrap();
    serve(engine, Arc::new(device), |d| {
        const CLUSTER: u64 = 64 << 10;
        // Whole clusters of old data, then freed: their host clusters may be handed out again.
        for i in 0..16u64 {
            assert_eq!(write(d, i * CLUSTER, &[0xee; 64 << 10]), spec::S_OK);
        }
        let s = range_op(d, spec::T_DISCARD, 0, 16 * CLUSTER, false);
        assert_eq!(s, spec::S_OK);
        // Small writes into new clusters, in the middle of each.
        for i in 0..32u64 {
            let at = 32 * MIB + i * CLUSTER + 8192;
            assert_eq!(write(d, at, &[0x42; 4096]), spec::S_OK);
        }
        for i in 0..32u64 {
            let (status, data) = read(d, 32 * MIB + i * CLUSTER, 64 << 10);
            assert_eq!(status, spec::S_OK);
            assert!(data[..8192].iter().all(|&b| b == 0), "cluster {i}: head");
            assert!(
                data[8192..12288].iter().all(|&b| b == 0x42),
                "cluster {i}: data"
            );
            assert!(data[12288..].iter().all(|&b| b == 0), "cluster {i}: tail");
        }
        for i in 0..16u64 {
            let (_, data) = read(d, i * CLUSTER, 64 << 10);
            assert!(data.iter().all(|&b| b == 0), "discarded cluster {i}");
        }
    });
    let check = qemu(at, "qemu-img", &["check", "disk.qcow2"]);
    assert!(check.contains("No errors were found"), "{check}");
}

/// The I/O statistics count each kind as QEMU's virtio-blk does: write-zeroes as writes,
/// discards as unmaps, `GET_ID` not at all, refused chains as invalid requests of their kind.
#[test]
fn io_statistics_count_each_kind_as_qemu_does() {
    let device = Arc::new(BlockDevice::null(64 * MIB, DiskOptions::default()).unwrap());
    let engine = EngineKind::Pool.build(&options()).unwrap();
    serve(engine, device.clone(), |d| {
        assert_eq!(write(d, 0, &[1; 4096]), spec::S_OK);
        assert_eq!(read(d, 4096, 8192).0, spec::S_OK);
        assert_eq!(one(d, spec::T_FLUSH, 0, 0), spec::S_OK);
        assert_eq!(range_op(d, spec::T_DISCARD, 0, MIB, false), spec::S_OK);
        let s = range_op(d, spec::T_WRITE_ZEROES, MIB, 64 << 10, false);
        assert_eq!(s, spec::S_OK);
        assert_eq!(one(d, spec::T_GET_ID, 0, 20), spec::S_OK);
        assert_eq!(one(d, spec::T_IN, 64 * MIB / 512, 4096), spec::S_IOERR);
        assert_eq!(write(d, 64 * MIB, &[1; 4096]), spec::S_IOERR);
        assert_eq!(write(d, 64 * MIB - 512, &[1; 4096]), spec::S_IOERR);
        let s = range_op(d, spec::T_DISCARD, 64 * MIB, MIB, false);
        assert_eq!(s, spec::S_IOERR);
    });
    let s = device.stats().snapshot();
    assert_eq!((s.read.operations, s.read.bytes), (1, 8192));
    assert_eq!((s.write.operations, s.write.bytes), (2, 4096 + (64 << 10)));
    assert_eq!(
        (s.flush.operations, s.unmap.operations, s.unmap.bytes),
        (1, 1, MIB)
    );
    assert_eq!(s.wr_highest_offset, MIB + (64 << 10));
    assert_eq!(s.read.failed + s.write.failed, 0);
    // Refused before they ran: QEMU's invalid requests, not operations.
    let invalid = [s.read, s.write, s.flush, s.unmap].map(|k| k.invalid);
    assert_eq!(invalid, [1, 2, 0, 1]);
    // The null device completes a request in the batch that took it: times read once per
    // batch make its time 0 (a file's requests, completed later, take time: tests/qmp.rs).
    assert!(s.idle_time_ns.is_some());
}
