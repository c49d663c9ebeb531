//! Images other than a raw file, served by the daemon to a libblkio client: qcow2 images made
//! by `qemu-img` (left clean by a stop, only leaking clusters after SIGKILL in the middle of
//! allocating writes, and opened again; a dirty one left by a killed `qemu-io` served read-only
//! until repaired; persistent dirty bitmaps tracked and kept consistent), and the null device.
//!
//! Needs `qemu-img` and `qemu-nbd` (Debian's `qemu-utils`) and `nbdinfo` (`libnbd-bin`);
//! `.ci/run` installs them.

mod common;

use std::process::Command;

use blkio::ReqFlags;
use common::{connect, connect_read_only, engines, image, qemu_img, Daemon};

/// A qcow2 image made by `qemu-img` (metadata preallocated, and not) is served as qcow2:
/// its virtual size, the client's writes read back, and after SIGTERM `qemu-img check` finds
/// it clean and `qemu-img compare` finds the client's data in it. The null device serves
/// zeros of the size it is given.
#[test]
fn a_qcow2_image_is_served_and_left_clean_and_the_null_device_reads_zeros() {
    let (dir, _) = image(1 << 20);
    for prealloc in ["off", "metadata"] {
        let qcow2 = dir.path().join(format!("{prealloc}.qcow2"));
        let q = qcow2.to_str().unwrap();
        let opt = format!("preallocation={prealloc}");
        qemu_img(&["create", "-q", "-f", "qcow2", "-o", &opt, q, "64M"]);
        let d = Daemon::one_disk(dir.path(), &qcow2, "pool", "");
        let mut c = connect(d.socket(), 1, 1 << 20).unwrap();
        assert_eq!(c.capacity().unwrap(), 64 << 20);
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        c.write_buf(0, &data);
        c.write(0, 3 << 20, 0, 1 << 20, 1);
        assert_eq!(c.wait(0, 1), [(1, 0)]);
        c.fill_buf(0, 1 << 20, 0);
        c.read(0, 3 << 20, 0, 1 << 20, 2);
        assert_eq!(c.wait(0, 1), [(2, 0)]);
        assert_eq!(c.read_buf(0, 1 << 20), data);
        drop(c);
        assert!(d.terminate().success());
        let check = qemu_img(&["check", q]);
        assert!(
            check.contains("No errors were found"),
            "{prealloc}: {check}"
        );
        // The same bytes, written into a raw file, compare equal with the image.
        let raw = dir.path().join(format!("{prealloc}.raw"));
        let mut want = vec![0u8; 64 << 20];
        want[3 << 20..4 << 20].copy_from_slice(&data);
        std::fs::write(&raw, want).unwrap();
        let r = raw.to_str().unwrap();
        qemu_img(&["compare", "-f", "qcow2", "-F", "raw", q, r]);
    }
    let sock = dir.path().join("null.sock");
    let disk = format!("socket={},image=null,size=8M", sock.display());
    let d = Daemon::start(&["--disk".to_string(), disk], vec![sock.clone()]);
    let mut c = connect(&sock, 1, 4096).unwrap();
    assert_eq!(c.capacity().unwrap(), 8 << 20);
    c.write_buf(0, &[0xaa; 4096]);
    c.write(0, 0, 0, 4096, 1);
    assert_eq!(c.wait(0, 1), [(1, 0)]);
    c.read(0, 0, 0, 4096, 2);
    assert_eq!(c.wait(0, 1), [(2, 0)]);
    assert!(c.read_buf(0, 4096).iter().all(|&b| b == 0));
    drop(c);
    assert!(d.terminate().success());
}

/// SIGKILL with allocating writes in flight: `qemu-img check` finds at most leaked clusters
/// (exit 0 or 3, never 2: corruption), and a new daemon serves the image with every write
/// that a flush had covered. For every engine.
#[test]
fn a_qcow2_image_killed_mid_allocation_only_leaks_and_opens_again() {
    const CLUSTER: usize = 64 << 10;
    const DEPTH: usize = 32;
    for engine in engines() {
        let (dir, _) = image(1 << 20);
        let qcow2 = dir.path().join("k.qcow2");
        let q = qcow2.to_str().unwrap();
        qemu_img(&["create", "-q", "-f", "qcow2", q, "256M"]);
        let d = Daemon::one_disk(dir.path(), &qcow2, engine, "");
        let mut c = connect(d.socket(), 1, DEPTH * CLUSTER).unwrap();
        // Round 0, flushed: must survive. Rounds 1.. allocate clusters until the kill.
        for round in 0..4usize {
            for i in 0..DEPTH {
                c.fill_buf(i * CLUSTER, CLUSTER, (round * DEPTH + i) as u8);
                let offset = ((round * DEPTH + i) * 3 * CLUSTER) as u64;
                c.write(0, offset, i * CLUSTER, CLUSTER, i);
            }
            if round == 3 {
                break; // Left in flight.
            }
            for (_, ret) in c.wait(0, DEPTH) {
                assert_eq!(ret, 0, "{engine}: write");
            }
            if round == 0 {
                assert_eq!(c.sync(0, |q| q.flush(99, ReqFlags::empty())), 0);
            }
        }
        let status = d.stop_with(nix::sys::signal::Signal::SIGKILL);
        assert!(!status.success());
        drop(c);
        let check = Command::new("qemu-img")
            .args(["check", q])
            .output()
            .unwrap();
        let code = check.status.code();
        assert!(
            matches!(code, Some(0) | Some(3)),
            "{engine}: qemu-img check exit {code:?}: {}",
            String::from_utf8_lossy(&check.stdout)
        );
        let d = Daemon::one_disk(dir.path(), &qcow2, engine, "");
        let mut c = connect(d.socket(), 1, CLUSTER).unwrap();
        for i in 0..DEPTH {
            c.read(0, (i * 3 * CLUSTER) as u64, 0, CLUSTER, i);
            assert_eq!(c.wait(0, 1), [(i, 0)]);
            let data = c.read_buf(0, CLUSTER);
            assert!(
                data.iter().all(|&b| b == i as u8),
                "{engine}: flushed cluster {i}"
            );
        }
        drop(c);
        assert!(d.terminate().success());
        println!("{engine}: killed mid-allocation, qemu-img check exit {code:?}, reopened");
    }
}

/// A qcow2 image with `lazy_refcounts=on` left dirty by a `qemu-io` killed after its writes
/// (QEMU's own crash): served read-only with a warning naming `qemu-img check -r all`, its
/// data read back, the file left as it was (`qemu-img check` finds the same state); once
/// repaired, served writable and left clean.
#[test]
fn a_dirty_qcow2_image_is_served_read_only_until_repaired() {
    let (dir, _) = image(1 << 20);
    let qcow2 = dir.path().join("dirty.qcow2");
    let q = qcow2.to_str().unwrap();
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "lazy_refcounts=on",
        q,
        "64M",
    ]);
    let killed = Command::new("qemu-io")
        .args(["-f", "qcow2", q])
        .args(["-c", "write -P 0x33 0 1M", "-c", "write -P 0x44 8M 1M"])
        .args(["-c", "sigraise 9"])
        .output()
        .expect("qemu-io (install qemu-utils)");
    assert!(!killed.status.success(), "qemu-io was to be killed");
    let check = |args: &[&str]| {
        let out = Command::new("qemu-img").args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let before = check(&["check", q]);
    assert_ne!(before.0, Some(0), "QEMU left it dirty: {}", before.1);
    let bytes = std::fs::read(&qcow2).unwrap();

    let mut d = Daemon::one_disk(dir.path(), &qcow2, "pool", "");
    // Read-only: libblkio refuses a writable client of it.
    assert!(connect(d.socket(), 1, 4096).is_err(), "served writable");
    let mut c = connect_read_only(d.socket(), 4096).unwrap();
    for (offset, byte) in [(0u64, 0x33u8), (8 << 20, 0x44)] {
        c.read(0, offset, 0, 4096, 1);
        assert_eq!(c.wait(0, 1), [(1, 0)]);
        assert!(
            c.read_buf(0, 4096).iter().all(|&b| b == byte),
            "at {offset}"
        );
    }
    drop(c);
    let log = d.log();
    assert!(
        log.contains("dirty") && log.contains("qemu-img check -r all"),
        "{log}"
    );
    assert!(d.terminate().success());
    assert_eq!(
        std::fs::read(&qcow2).unwrap(),
        bytes,
        "the file is untouched"
    );
    assert_eq!(check(&["check", q]), before);

    let repaired = check(&["check", "-r", "all", q]);
    assert_eq!(repaired.0, Some(0), "{}", repaired.1);
    let d = Daemon::one_disk(dir.path(), &qcow2, "pool", "");
    let mut c = connect(d.socket(), 1, 4096).unwrap();
    c.fill_buf(0, 4096, 0x55);
    c.write(0, 16 << 20, 0, 4096, 2);
    assert_eq!(c.wait(0, 1), [(2, 0)]);
    c.read(0, 8 << 20, 0, 4096, 3);
    assert_eq!(c.wait(0, 1), [(3, 0)]);
    assert!(c.read_buf(0, 4096).iter().all(|&b| b == 0x44));
    drop(c);
    assert!(d.terminate().success());
    let after = check(&["check", q]);
    assert_eq!(after.0, Some(0), "{}", after.1);
}

/// A qcow2 image's persistent dirty bitmaps (libvirt's backup checkpoints, made here by
/// `qemu-img bitmap --add`) track the daemon's writes and stay consistent in the file while
/// it serves the image writable (what a SIGKILL leaves is `crash_bitmaps.rs`'s): none is marked
/// `in-use`, nothing is said, and they are never dropped by clearing the bitmaps autoclear bit
/// (after which `qemu-img check` reported their clusters leaked and QEMU discarded them).
/// After SIGTERM `qemu-img check` finds no error and no leak, `qemu-img info` lists both
/// bitmaps consistent (`auto`) with their granularity, and QEMU's own NBD server
/// (`qemu-nbd -B`) reads exactly the three ranges the daemon wrote as dirty in each. Served
/// read-only, nothing is written; served again, nothing is said.
#[test]
fn a_qcow2_images_dirty_bitmaps_track_the_daemons_writes_and_stay_consistent() {
    let (dir, _) = image(1 << 20);
    let qcow2 = dir.path().join("checkpoints.qcow2");
    let q = qcow2.to_str().unwrap();
    qemu_img(&["create", "-q", "-f", "qcow2", q, "64M"]);
    qemu_img(&["bitmap", "--add", q, "ck1"]);
    qemu_img(&["bitmap", "--add", "-g", "128K", q, "ck2"]);
    let before = qemu_img(&["info", "--output=json", q]);
    assert!(!before.contains("in-use"), "{before}");

    // Served read-only: nothing is written, the bitmaps stay consistent.
    let d = Daemon::one_disk(dir.path(), &qcow2, "pool", ",readonly=on");
    drop(connect_read_only(d.socket(), 4096).unwrap());
    assert!(d.terminate().success());
    let read_only = qemu_img(&["info", "--output=json", q]);
    assert!(!read_only.contains("in-use"), "{read_only}");

    let mut d = Daemon::one_disk(dir.path(), &qcow2, "pool", "");
    let mut c = connect(d.socket(), 1, 1 << 20).unwrap();
    c.write_buf(0, &[0x5a; 1 << 20]);
    for (i, offset) in [0u64, 5 << 20, 63 << 20].into_iter().enumerate() {
        c.write(0, offset, 0, 1 << 20, i);
        assert_eq!(c.wait(0, 1), [(i, 0)]);
    }
    drop(c);
    let serving = qemu_img(&["info", "-U", "--output=json", q]);
    assert!(
        !serving.contains("in-use"),
        "consistent while served writable: {serving}"
    );
    assert!(!d.log().contains("bitmap"), "nothing said: {}", d.log());
    assert!(d.terminate().success());

    let check = qemu_img(&["check", q]);
    assert!(check.contains("No errors were found"), "{check}");
    assert!(!check.contains("leaked"), "{check}");
    assert!(!check.contains("bitmap"), "{check}");
    let info: serde_json::Value =
        serde_json::from_str(&qemu_img(&["info", "--output=json", q])).unwrap();
    let bitmaps = info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .unwrap_or_else(|| panic!("no bitmaps left: {info}"));
    let names: Vec<_> = bitmaps
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ck1", "ck2"], "{info}");
    for b in bitmaps {
        assert_eq!(b["flags"], serde_json::json!(["auto"]), "{b}");
    }
    assert_eq!(bitmaps[1]["granularity"], 128 << 10, "{info}");
    let written = [(0, 1 << 20), (5 << 20, 1 << 20), (63 << 20, 1 << 20)];
    for name in ["ck1", "ck2"] {
        assert_eq!(
            dirty_ranges_read_by_qemu(dir.path(), q, name),
            written,
            "{name}"
        );
    }
    qemu_io_reads(q, 0x5a, 63 << 20);

    // Served again: the bitmaps are consistent, nothing is said of them.
    let mut d = Daemon::one_disk(dir.path(), &qcow2, "pool", "");
    drop(connect(d.socket(), 1, 4096).unwrap());
    let log = d.log();
    assert!(!log.contains("bitmap"), "{log}");
    assert!(d.terminate().success());
    qemu_img(&["bitmap", "--remove", q, "ck1"]);
    let check = qemu_img(&["check", q]);
    assert!(check.contains("No errors were found"), "{check}");
}

/// The dirty ranges of bitmap `name` of the qcow2 image `path`, as QEMU reads them: served by
/// `qemu-nbd -B NAME` and mapped by `nbdinfo --map=qemu:dirty-bitmap:NAME`.
fn dirty_ranges_read_by_qemu(dir: &std::path::Path, path: &str, name: &str) -> Vec<(u64, u64)> {
    let socket = dir.join(format!("qemu-nbd-{name}.sock"));
    // `--fork` returns once the server listens; without `--persistent` it ends after the one
    // client below disconnects.
    let started = Command::new("qemu-nbd")
        .args(["--fork", "-r", "-f", "qcow2", "-B", name, "-k"])
        .arg(&socket)
        .arg(path)
        .status()
        .expect("qemu-nbd (install qemu-utils)");
    assert!(started.success(), "qemu-nbd -B {name} {path}");
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let out = Command::new("nbdinfo")
        .arg(format!("--map=qemu:dirty-bitmap:{name}"))
        .arg(&uri)
        .output()
        .expect("nbdinfo (install libnbd-bin)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nbdinfo: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each line: offset, length, type (1: dirty), description.
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.get(2) == Some(&"1")).then(|| (f[0].parse().unwrap(), f[1].parse().unwrap()))
        })
        .collect()
}

/// `qemu-io` reads 1 MiB of `pattern` at `offset` of the qcow2 image `path`.
fn qemu_io_reads(path: &str, pattern: u8, offset: u64) {
    let cmd = format!("read -P {pattern:#x} {offset} 1M");
    let out = Command::new("qemu-io")
        .args(["-f", "qcow2", "-r", "-c", &cmd, path])
        .output()
        .expect("qemu-io (install qemu-utils)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("read 1048576/1048576"),
        "{cmd}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
