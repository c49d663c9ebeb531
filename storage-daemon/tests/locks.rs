//! Image locks against QEMU's own tools, in both directions: while the daemon serves an image
//! writable, `qemu-io` writes, `qemu-img resize` and a qemu-storage-daemon export of it are
//! refused and `qemu-img info -U` works; while `qemu-io` or qemu-storage-daemon uses it, the
//! daemon is refused with exit 2 naming the image and the permission; two daemons on one
//! qcow2 image leave it clean; `locking=off` and `share-rw=on` let a second writer in.
//!
//! Needs `qemu-img`, `qemu-io` and `qemu-storage-daemon` (Debian's `qemu-utils`; `.ci/run`
//! installs it).

mod common;
#[path = "common/qmp.rs"]
mod qmp;

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use aio_block::lock::{Access, ImageLock, LockMode};
use aio_test_support::tool::text;
use common::{daemon_refused, ended_within, image, qemu_img, Daemon};
use qmp::Qmp;
use serde_json::json;

/// One `--disk` on `image` in `dir` (socket `NAME.sock`).
fn disk_args(dir: &Path, name: &str, image: &Path, extra: &str) -> (Vec<String>, PathBuf) {
    let socket = dir.join(format!("{name}.sock"));
    let spec = format!(
        "socket={},image={}{extra}",
        socket.display(),
        image.display()
    );
    (
        vec!["--disk".into(), spec, "--engine".into(), "pool".into()],
        socket,
    )
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (install qemu-utils)"))
}

/// A raw image of 16 MiB holding 0x5a everywhere, and a qcow2 image over it as backing file.
fn images() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (dir, raw) = image(16 << 20);
    std::fs::write(&raw, vec![0x5au8; 16 << 20]).unwrap();
    let top = dir.path().join("top.qcow2");
    let (r, t) = (raw.to_str().unwrap(), top.to_str().unwrap());
    qemu_img(&["create", "-q", "-f", "qcow2", "-b", r, "-F", "raw", t]);
    (dir, raw, top)
}

/// `qemu-io` holding `image` open for writing (an interactive session whose input stays open
/// until it is dropped), once its locks are seen.
struct QemuIo(Child);

impl QemuIo {
    fn hold(format: &str, image: &Path) -> QemuIo {
        Self::hold_all(format, image, &[image])
    }

    /// `hold`, seen once every file of `locked` (the image and its backing files) has locks:
    /// qemu-io locks a backing file after the image, so one seen is not both.
    fn hold_all(format: &str, image: &Path, locked: &[&Path]) -> QemuIo {
        let child = Command::new("qemu-io")
            .args(["-f", format])
            .arg(image)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("qemu-io (install qemu-utils)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while locked.iter().any(|p| lock_bytes(p).is_empty()) {
            assert!(Instant::now() < deadline, "qemu-io never locked the image");
            std::thread::sleep(Duration::from_millis(20));
        }
        QemuIo(child)
    }
}

impl Drop for QemuIo {
    fn drop(&mut self) {
        if let Some(mut input) = self.0.stdin.take() {
            let _ = input.write_all(b"quit\n");
        }
        let _ = self.0.wait();
    }
}

/// The OFD lock bytes any process holds on `path`'s file, from `/proc/locks`.
fn lock_bytes(path: &Path) -> BTreeSet<u64> {
    let ino = std::fs::metadata(path).unwrap().ino().to_string();
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    let mut bytes = BTreeSet::new();
    for line in locks.lines().filter(|l| l.contains("OFDLCK")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // N: OFDLCK ADVISORY READ -1 MAJ:MIN:INODE START END
        let Some(at) = f.iter().position(|w| w.matches(':').count() == 2) else {
            continue;
        };
        if f[at].rsplit(':').next() != Some(ino.as_str()) {
            continue;
        }
        let (Ok(start), Ok(end)) = (f[at + 1].parse::<u64>(), f[at + 2].parse::<u64>()) else {
            continue;
        };
        bytes.extend(start..=end);
    }
    bytes
}

/// The daemon's refusal: exit 2, the image named, the permission in QEMU's words.
fn assert_refused(args: &[String], image: &Path, permission: &str) {
    let (code, err) = daemon_refused(args, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("\"{permission}\" lock")),
        "names the permission: {err}"
    );
    assert!(
        err.contains(&image.display().to_string()) && err.contains("another process"),
        "names the image: {err}"
    );
}

#[test]
fn a_qemu_io_write_is_refused_while_the_daemon_serves_the_image_and_info_u_works() {
    let (dir, raw, _) = images();
    let (args, socket) = disk_args(dir.path(), "d", &raw, ",format=raw");
    let d = Daemon::start(&args, vec![socket]);
    let r = raw.to_str().unwrap();
    let out = run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4k", r]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Failed to get \"write\" lock"),
        "{}",
        text(&out)
    );
    assert!(std::fs::read(&raw).unwrap()[..4096]
        .iter()
        .all(|&b| b == 0x5a));
    let info = run("qemu-img", &["info", "-U", "-f", "raw", r]);
    assert!(info.status.success(), "{}", text(&info));
    assert!(text(&info).contains("16 MiB"), "{}", text(&info));
    assert!(d.terminate().success());
    // Released at the stop: the same write goes through.
    let out = run("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4k", r]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn qemu_img_resize_is_refused_while_the_daemon_serves_the_image() {
    let (dir, _, top) = images();
    let (args, socket) = disk_args(dir.path(), "d", &top, "");
    let d = Daemon::start(&args, vec![socket]);
    let t = top.to_str().unwrap();
    let out = run("qemu-img", &["resize", "-f", "qcow2", t, "32M"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("lock"), "{}", text(&out));
    assert!(d.terminate().success());
    let info = qemu_img(&["info", "-f", "qcow2", t]);
    assert!(info.contains("16 MiB"), "the size is unchanged: {info}");
}

#[test]
fn a_qemu_storage_daemon_export_is_refused_while_the_daemon_serves_the_image() {
    let (dir, raw, _) = images();
    let (args, socket) = disk_args(dir.path(), "d", &raw, ",format=raw");
    let d = Daemon::start(&args, vec![socket]);
    let qsd_dir = dir.path().join("qsd");
    std::fs::create_dir(&qsd_dir).unwrap();
    let out = Command::new("qemu-storage-daemon")
        .arg("--blockdev")
        .arg(format!(
            "driver=file,node-name=f,filename={},cache.direct=on",
            raw.display()
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path={},writable=on",
            qsd_dir.join("qsd.sock").display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-storage-daemon (install qemu-utils)");
    let out = ended_within(out, Duration::from_secs(20));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Failed to get \"write\" lock"),
        "{}",
        text(&out)
    );
    assert!(d.terminate().success());
}

#[test]
fn the_daemon_is_refused_with_exit_2_while_qemu_io_writes_the_image() {
    let (dir, raw, _) = images();
    let held = QemuIo::hold("raw", &raw);
    let (args, _) = disk_args(dir.path(), "d", &raw, ",format=raw");
    // qemu-io holds write (byte 101) and shares it; this disk does not share write.
    assert_refused(&args, &raw, "write");
    // Read-only, it is refused as well: it would not share write with a writer.
    let (ro, _) = disk_args(dir.path(), "r", &raw, ",format=raw,readonly=on");
    assert_refused(&ro, &raw, "write");
    drop(held);
    let (args, socket) = disk_args(dir.path(), "d", &raw, ",format=raw");
    assert!(Daemon::start(&args, vec![socket]).terminate().success());
}

#[test]
fn the_daemon_is_refused_with_exit_2_while_qemu_storage_daemon_serves_the_image() {
    let (dir, raw, _) = images();
    let qsd_dir = dir.path().join("qsd");
    std::fs::create_dir(&qsd_dir).unwrap();
    let (qsd, _, _) = qmp::start("qemu-storage-daemon", &qsd_dir, &raw);
    let (args, _) = disk_args(dir.path(), "d", &raw, ",format=raw");
    assert_refused(&args, &raw, "write");
    drop(qsd);
}

#[test]
fn a_second_daemon_on_one_qcow2_image_is_refused_and_the_image_stays_clean() {
    let (dir, _, top) = images();
    let (first, socket) = disk_args(dir.path(), "a", &top, "");
    let d = Daemon::start(&first, vec![socket.clone()]);
    let (second, _) = disk_args(dir.path(), "b", &top, "");
    assert_refused(&second, &top, "write");
    // A qcow2 image never shares write: share-rw=on does not let a second writer in.
    let (shared, _) = disk_args(dir.path(), "c", &top, ",share-rw=on");
    assert_refused(&shared, &top, "write");
    qmp::disk_works(&socket);
    assert!(d.terminate().success());
    let t = top.to_str().unwrap();
    let check = qemu_img(&["check", "-f", "qcow2", t]);
    assert!(check.contains("No errors were found"), "{check}");
}

#[test]
fn locking_off_and_share_rw_on_let_a_second_writer_in() {
    let (dir, raw, _) = images();
    let (a, sa) = disk_args(dir.path(), "a", &raw, ",format=raw,share-rw=on");
    let first = Daemon::start(&a, vec![sa.clone()]);
    let (b, sb) = disk_args(dir.path(), "b", &raw, ",format=raw,share-rw=on");
    let second = Daemon::start(&b, vec![sb.clone()]);
    qmp::disk_works(&sa);
    qmp::disk_works(&sb);
    // Neither shares write with a third that will not share it.
    let (c, _) = disk_args(dir.path(), "c", &raw, ",format=raw");
    assert_refused(&c, &raw, "write");
    assert!(second.terminate().success());
    assert!(first.terminate().success());

    let (a, sa) = disk_args(dir.path(), "a", &raw, ",format=raw");
    let first = Daemon::start(&a, vec![sa]);
    let (b, sb) = disk_args(dir.path(), "b", &raw, ",format=raw,locking=off");
    let second = Daemon::start(&b, vec![sb.clone()]);
    qmp::disk_works(&sb);
    assert!(second.terminate().success());
    assert!(first.terminate().success());
}

/// The bytes the daemon holds on a qcow2 image and its backing file are the bytes `qemu-io`
/// holds on them: QEMU's tools read ours as their own.
#[test]
fn the_daemon_holds_qemus_lock_bytes_on_a_qcow2_image_and_its_backing_file() {
    let (dir, raw, top) = images();
    let held = QemuIo::hold_all("qcow2", &top, &[&top, &raw]);
    let qemus = (lock_bytes(&top), lock_bytes(&raw));
    drop(held);
    assert_eq!(
        qemus.0,
        BTreeSet::from([100, 101, 103, 201, 203]),
        "qemu-io's own bytes on a writable qcow2 image"
    );
    let (args, socket) = disk_args(dir.path(), "d", &top, "");
    let d = Daemon::start(&args, vec![socket]);
    assert_eq!((lock_bytes(&top), lock_bytes(&raw)), qemus);
    assert!(d.terminate().success());
    assert!(lock_bytes(&top).is_empty() && lock_bytes(&raw).is_empty());
}

/// QMP `blockdev-add` of a qcow2 node whose image another process writes fails as
/// qemu-storage-daemon's does: the same error class and text.
#[test]
fn blockdev_add_of_an_image_in_use_fails_with_qemus_error() {
    let (dir, raw, top) = images();
    let node = json!({
        "driver": "qcow2",
        "node-name": "q",
        "file": {"driver": "file", "filename": top.display().to_string()},
    });
    let held = QemuIo::hold("qcow2", &top);
    let mut errors = Vec::new();
    for program in [
        env!("CARGO_BIN_EXE_aio-storage-daemon"),
        "qemu-storage-daemon",
    ] {
        let at = dir
            .path()
            .join(if errors.is_empty() { "ours" } else { "qsd" });
        std::fs::create_dir(&at).unwrap();
        let copy = at.join("base.raw");
        std::fs::copy(&raw, &copy).unwrap();
        let (mut daemon, _, monitor) = qmp::start(program, &at, &copy);
        let (mut q, _) = Qmp::connect(&monitor, false);
        errors.push(q.error("blockdev-add", node.clone()));
        drop(q);
        daemon.kill();
    }
    assert_eq!(
        errors[0],
        (
            "GenericError".to_string(),
            "Failed to get \"write\" lock".to_string()
        )
    );
    assert_eq!(errors[0], errors[1], "ours, then qemu-storage-daemon's");
    drop(held);
    // Once the writer is gone, the node is added.
    let again = dir.path().join("again");
    std::fs::create_dir(&again).unwrap();
    let copy = again.join("base.raw");
    std::fs::copy(&raw, &copy).unwrap();
    let (mut daemon, _, monitor) =
        qmp::start(env!("CARGO_BIN_EXE_aio-storage-daemon"), &again, &copy);
    let (mut q, _) = Qmp::connect(&monitor, false);
    q.ok("blockdev-add", node);
    drop(q);
    daemon.kill();
}

/// The lock module alone sees QEMU's locks: a writer's access is refused while `qemu-io`
/// holds the image, and granted after.
#[test]
fn the_lock_module_sees_qemu_io() {
    let (_dir, raw, _) = images();
    let file = std::fs::File::open(&raw).unwrap();
    let held = QemuIo::hold("raw", &raw);
    let e = ImageLock::acquire(&file, &raw, Access::disk(true, false), LockMode::On).unwrap_err();
    assert!(e.to_string().contains("\"write\" lock"), "{e}");
    drop(held);
    let lock = ImageLock::acquire(&file, &raw, Access::disk(true, false), LockMode::On).unwrap();
    assert!(lock.is_locked());
}
