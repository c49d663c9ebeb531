//! A real Linux guest on qcow2 images served by the daemon, checked with QEMU's own tools.
//!
//! - `guest_checks_a_qcow2_disk`: the guest's whole write check list (fio with verify at
//!   queue depth 1 and 16 on both queues, mkfs.ext4, files written, read back after dropping
//!   caches and after a remount, fsck, blkdiscard) on a qcow2 image made by `qemu-img create`;
//!   after SIGTERM, `qemu-img check` must find the image clean (exit 0: not even a leak).
//! - `guest_checks_a_qcow2_disk_over_nbd`: the same check list on a qcow2 image our daemon
//!   exports over NBD, the guest's disk QEMU's NBD client under a virtio-blk device.
//! - `guest_writes_the_same_qcow2_image_as_qemu_storage_daemon`: the guest's replay workload
//!   (the same writes on every run: fio with a fixed seed and verify, discard and write-zeroes,
//!   some ranges not cluster-aligned) on a qcow2 overlay of a raw backing file holding a
//!   pattern, once through our daemon and once through qemu-storage-daemon, each on its own copy
//!   of the same overlay; both images must pass `qemu-img check`, and `qemu-img compare` must
//!   find them equal, as must the sha256 the guest read through each.
//!
//! The guest is the one `guest.rs` boots (`scripts/build-guest.sh`, TCG). Where QEMU or the
//! packages cannot be had the tests print `skipped: <reason>` and pass, unless
//! `AIO_REQUIRE_ALL_BACKENDS=1` says nothing may be skipped.

use aio_conformance::skip;
use aio_test_support::launch::{Daemon, Launch};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

mod common;
#[path = "guest/harness.rs"]
#[allow(dead_code)] // shared with guest.rs and guest_restart.rs
mod harness;
use harness::{
    export_args, guest_image, run_guest, runnable, spawn, stop_cleanly, GuestRun, GuestSpec,
    REPLAY_CHECKS, RW_CHECKS,
};

/// The guest's disk: 256 MiB of virtual size.
const CAPACITY: u64 = 256 << 20;
/// The serial our daemon is given and the guest must read back.
const SERIAL: &str = "aio-qcow2-1";
/// Request queues served, asked for by QEMU's device, and used by the guest's two vCPUs.
const QUEUES: u32 = 2;
/// One guest at a time: two TCG guests on a two-CPU machine slow each other past their limits.
static GUESTS: Mutex<()> = Mutex::new(());

/// Runs `qemu-img` with `args` and returns its exit code and standard output.
fn qemu_img(args: &[&str]) -> (Option<i32>, String) {
    let out = aio_test_support::tool::output("qemu-img", args);
    (out.status.code(), aio_test_support::tool::text(&out))
}

/// Asserts that `qemu-img check` finds `image` clean: exit 0, no leak, no corruption.
fn assert_clean(image: &Path) {
    let (code, said) = qemu_img(&["check", path_str(image)]);
    println!("qemu-img check {}: exit {code:?}\n{said}", image.display());
    assert_eq!(code, Some(0), "qemu-img check {}: {said}", image.display());
}

/// `path` as a `&str` (the temporary directories this test makes are UTF-8).
fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Whether QEMU's tools this file needs are installed; says why not through `skip`.
fn tools_present(qsd: bool) -> bool {
    if !runnable("qemu-img") {
        skip("qemu-img is not installed (Debian package qemu-utils)");
        return false;
    }
    if qsd && !runnable("qemu-storage-daemon") {
        skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return false;
    }
    true
}

/// Starts our daemon serving `image` on `socket` with the extra `--disk` options `extra` and
/// the engine `engine` (the daemon's default when None), and waits for the socket.
fn start_ours(
    dir: &Path,
    socket: &Path,
    image: &Path,
    extra: &str,
    engine: Option<&str>,
) -> Daemon {
    let mut launch = Launch::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
        .label("aio-storage-daemon")
        .log_to(dir.join("daemon.log"))
        .socket(socket);
    if let Some(engine) = engine {
        launch = launch.args(["--engine", engine]);
    }
    spawn(launch.arg("--disk").arg(format!(
        "socket={},image={},serial={SERIAL},queues={QUEUES}{extra}",
        socket.display(),
        image.display()
    )))
}

/// The guest's spec on `socket` with the checks `checks` and the kernel options `append`.
fn spec<'a>(socket: &'a Path, serial: Option<&'a str>, checks: &'a [&'a str]) -> GuestSpec<'a> {
    GuestSpec {
        socket,
        capacity: CAPACITY,
        serial,
        queues: QUEUES,
        checks,
        append: String::new(),
        reconnect: false,
        monitor: None,
        nbd_export: None,
    }
}

/// A fresh qcow2 image of the guest's capacity (64 KiB clusters) in a temporary directory.
fn new_qcow2() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = dir.path().join("disk.qcow2");
    let (code, said) = qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        path_str(&disk),
        &CAPACITY.to_string(),
    ]);
    assert_eq!(code, Some(0), "qemu-img create: {said}");
    (dir, disk)
}

/// The guest's write check list on a fresh qcow2 image (64 KiB clusters) served by our daemon
/// (`format=auto` finds it): every check passes, and after SIGTERM the image is clean.
#[test]
fn guest_checks_a_qcow2_disk() {
    let Some(image) = guest_image() else { return };
    if !tools_present(false) {
        return;
    }
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, disk) = new_qcow2();
    let socket = dir.path().join("vhost-user-blk.sock");
    let daemon = start_ours(dir.path(), &socket, &disk, "", None);
    let spec = spec(&socket, Some(SERIAL), RW_CHECKS);
    run_guest(image, &spec, "qcow2-rw", &mut |_| {}).assert_passed(&spec);
    stop_cleanly(daemon);
    assert_clean(&disk);
}

/// The guest's write check list on a qcow2 image our daemon exports over NBD, through QEMU's
/// NBD client (`-blockdev driver=nbd`) under a virtio-blk device: every check passes (fio
/// verify at depth 1 and 16, a file system), and after SIGTERM the image is clean.
#[test]
fn guest_checks_a_qcow2_disk_over_nbd() {
    let Some(image) = guest_image() else { return };
    if !tools_present(false) {
        return;
    }
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, disk) = new_qcow2();
    let socket = dir.path().join("nbd.sock");
    let daemon = spawn(
        Launch::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
            .label("aio-storage-daemon")
            .args(["--nbd".to_string(), format!("unix:{}", socket.display())])
            .arg("--nbd-export")
            .arg(format!("name=vm,image={},writable=on", disk.display()))
            .log_to(dir.path().join("daemon.log"))
            .socket(&socket),
    );
    let mut spec = spec(&socket, Some(SERIAL), RW_CHECKS);
    spec.nbd_export = Some("vm");
    run_guest(image, &spec, "qcow2-nbd", &mut |_| {}).assert_passed(&spec);
    stop_cleanly(daemon);
    assert_clean(&disk);
}

/// Makes, in `dir`, a raw backing file whose first 64 MiB hold the byte 0x5a, and a qcow2
/// overlay of it (64 KiB clusters) named `overlay.qcow2`, which refers to its backing file by
/// a relative name. Returns the overlay.
fn overlay_on_pattern(dir: &Path) -> PathBuf {
    let base = dir.join("base.raw");
    let overlay = dir.join("overlay.qcow2");
    let (code, said) = qemu_img(&[
        "create",
        "-q",
        "-f",
        "raw",
        path_str(&base),
        &CAPACITY.to_string(),
    ]);
    assert_eq!(code, Some(0), "qemu-img create: {said}");
    let wrote = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 0 64M", path_str(&base)])
        .output()
        .expect("run qemu-io (Debian package qemu-utils)");
    assert!(wrote.status.success(), "qemu-io: {wrote:?}");
    let (code, said) = qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        path_str(&overlay),
    ]);
    assert_eq!(code, Some(0), "qemu-img create the overlay: {said}");
    overlay
}

/// Runs the replay workload against whatever serves `socket`, asserting every check (the
/// serial only when given), and returns the run.
fn replay(socket: &Path, serial: Option<&str>, name: &str) -> GuestRun {
    let image = guest_image().expect("the guest was built");
    let mut spec = spec(socket, serial, REPLAY_CHECKS);
    spec.append = "aio.mode=replay".to_string();
    let run = run_guest(image, &spec, name, &mut |_| {});
    run.assert_passed(&spec);
    run
}

/// Runs the replay workload through qemu-storage-daemon on a fresh overlay in `dir` (its
/// `discard=unmap`, since QEMU ignores a guest's discard unless told), and returns the overlay
/// and the guest's run.
fn replay_through_qsd(dir: &Path) -> (PathBuf, GuestRun) {
    let overlay = overlay_on_pattern(dir);
    let socket = dir.join("qsd.sock");
    let qsd = spawn(
        Launch::new("qemu-storage-daemon")
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=file0,filename={},cache.direct=on,discard=unmap",
                overlay.display()
            ))
            .arg("--blockdev")
            .arg("driver=qcow2,node-name=disk0,file=file0,discard=unmap")
            .args(export_args(&socket, QUEUES, true))
            .log_to(dir.join("qsd.log"))
            .socket(&socket),
    );
    // qemu-storage-daemon's serial cannot be set: that check is reported, not asserted.
    let run = replay(&socket, None, "qcow2-replay-qsd");
    stop_cleanly(qsd);
    assert_clean(&overlay);
    (overlay, run)
}

/// The replay workload through qemu-storage-daemon, then through our daemon with each engine,
/// each on its own copy of one qcow2 overlay of a raw backing file: every image clean, and
/// each of ours equal to QEMU's.
#[test]
fn guest_writes_the_same_qcow2_image_as_qemu_storage_daemon() {
    if guest_image().is_none() || !tools_present(true) {
        return;
    }
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let theirs_dir = tempfile::tempdir().expect("tempdir");
    let (theirs, their_run) = replay_through_qsd(theirs_dir.path());
    let theirs_sum = their_run.info("disk_sha256");
    assert!(theirs_sum.is_some(), "the guest printed no disk_sha256");
    for engine in common::engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ours = overlay_on_pattern(dir.path());
        let socket = dir.path().join("vhost-user-blk.sock");
        let daemon = start_ours(dir.path(), &socket, &ours, ",format=qcow2", Some(engine));
        let run = replay(&socket, Some(SERIAL), &format!("qcow2-replay-{engine}"));
        stop_cleanly(daemon);
        assert_clean(&ours);
        let (code, said) = qemu_img(&[
            "compare",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            path_str(&ours),
            path_str(&theirs),
        ]);
        assert_eq!(
            code,
            Some(0),
            "qemu-img compare ours ({engine}) theirs: {said}"
        );
        assert_eq!(
            run.info("disk_sha256"),
            theirs_sum,
            "the disk the guest read through our daemon ({engine}) and qemu-storage-daemon"
        );
    }
}
