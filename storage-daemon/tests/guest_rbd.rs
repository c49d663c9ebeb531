//! A real Linux guest on RBD disks in a one-node Ceph cluster, checked against
//! qemu-storage-daemon's own `driver=rbd`.
//!
//! - `guest_checks_an_rbd_disk`: the guest's whole write check list (fio with verify at queue
//!   depth 1 and 16 on both queues, mkfs.ext4, files written, read back after dropping caches
//!   and after a remount, fsck, blkdiscard) on an RBD image our daemon serves
//!   (`image=rbd:...`); `qemu-img info` and librbd then report the size the guest saw.
//! - `guest_writes_the_same_rbd_image_as_qemu_storage_daemon`: the guest's replay workload
//!   (the same writes on every run) through qemu-storage-daemon's `--blockdev driver=rbd` on
//!   one image and through ours (its `--blockdev driver=rbd` form) on another: `qemu-img
//!   compare` finds the two images equal, and the guest read the same sha256 through each.
//!
//! Needs the guest (`scripts/build-guest.sh`), QEMU, and `qemu-block-extra` for
//! qemu-storage-daemon's and `qemu-img`'s `rbd` driver; without them the tests print
//! `skipped: <reason>`, unless `AIO_REQUIRE_ALL_BACKENDS=1`.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use aio_conformance::skip;
use aio_rbd::testing::TestCluster;
use aio_rbd::{ImageSpec, RbdImage};
use aio_test_support::launch::{Daemon, Launch};

mod common;
#[path = "guest/harness.rs"]
#[allow(dead_code)] // shared with the other guest tests
mod harness;
use harness::{
    export_args, guest_image, run_guest, spawn, stop_cleanly, GuestSpec, REPLAY_CHECKS, RW_CHECKS,
};

/// The guest's disk: 256 MiB.
const CAPACITY: u64 = 256 << 20;
const SERIAL: &str = "aio-rbd-1";
const QUEUES: u32 = 2;
/// One guest at a time: two TCG guests on a two-CPU machine slow each other past their limits.
static GUESTS: Mutex<()> = Mutex::new(());

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

/// Whether qemu-img reads `rbd:` (qemu-block-extra); says why not through `skip`.
fn qemu_rbd_present(conf: &Path) -> bool {
    let out = Command::new("qemu-img")
        .args(["--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(" rbd "));
    if !matches!(out, Ok(true)) {
        skip(&format!(
            "qemu-img has no rbd driver (Debian package qemu-block-extra); cluster {}",
            conf.display()
        ));
        return false;
    }
    true
}

fn qemu_img(args: &[&str]) -> (Option<i32>, String) {
    let out = aio_test_support::tool::output("qemu-img", args);
    (out.status.code(), aio_test_support::tool::text(&out))
}

#[test]
fn guest_checks_an_rbd_disk() {
    let Some(image) = guest_image() else { return };
    let Some(test) = TestCluster::get() else {
        return;
    };
    if !qemu_rbd_present(test.conf()) {
        return;
    }
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let rbd = TestCluster::new_image(&test.connect(), "guest", CAPACITY);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vhost-user-blk.sock");
    let daemon = spawn(
        Launch::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
            .label("aio-storage-daemon")
            .env("AIO_STORAGE_DAEMON_RUN_DIR", dir.path())
            .arg("--disk")
            .arg(format!(
                "socket={},image={},serial={SERIAL},queues={QUEUES}",
                socket.display(),
                test.qemu_name(&rbd)
            ))
            .log_to(dir.path().join("daemon.log"))
            .socket(&socket),
    );
    let spec = spec(&socket, Some(SERIAL), RW_CHECKS);
    run_guest(image, &spec, "rbd-rw", &mut |_| {}).assert_passed(&spec);
    stop_cleanly(daemon);
    let (code, said) = qemu_img(&["info", "--output=json", &test.qemu_name(&rbd)]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("\"virtual-size\": {CAPACITY}")),
        "{said}"
    );
    let opened = RbdImage::open(&test.connect(), &rbd, false).unwrap();
    assert_eq!(opened.size().unwrap(), CAPACITY);
    assert_eq!(
        opened.lock_owners().unwrap(),
        Vec::<String>::new(),
        "released on stop"
    );
}

/// Runs the replay workload on whatever serves `socket`.
fn replay(socket: &Path, serial: Option<&str>, name: &str) -> harness::GuestRun {
    let image = guest_image().expect("the guest was built");
    let mut spec = spec(socket, serial, REPLAY_CHECKS);
    spec.append = "aio.mode=replay".to_string();
    let run = run_guest(image, &spec, name, &mut |_| {});
    run.assert_passed(&spec);
    run
}

/// The daemon `program` with `--blockdev driver=rbd` on `rbd` exported on `socket`.
fn blockdev_daemon(program: &str, test: &TestCluster, rbd: &ImageSpec, dir: &Path) -> Daemon {
    let socket = dir.join("disk.sock");
    spawn(
        Launch::new(program)
            .env("AIO_STORAGE_DAEMON_RUN_DIR", dir)
            .arg("--blockdev")
            .arg(format!(
                "driver=rbd,node-name=disk0,pool={},image={},conf={},user=admin,discard=unmap",
                rbd.pool,
                rbd.image,
                test.conf().display()
            ))
            .args(export_args(&socket, QUEUES, true))
            .log_to(dir.join("daemon.log"))
            .socket(&socket),
    )
}

#[test]
fn guest_writes_the_same_rbd_image_as_qemu_storage_daemon() {
    if guest_image().is_none() || !harness::runnable("qemu-storage-daemon") {
        skip("no guest, or no qemu-storage-daemon (qemu-utils)");
        return;
    }
    let Some(test) = TestCluster::get() else {
        return;
    };
    if !qemu_rbd_present(test.conf()) {
        return;
    }
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let (theirs, ours) = {
        let cluster = test.connect();
        let image = || TestCluster::new_image(&cluster, "guest", CAPACITY);
        (image(), image())
    };
    let dir = tempfile::tempdir().unwrap();
    let qsd = blockdev_daemon("qemu-storage-daemon", &test, &theirs, dir.path());
    let their_run = replay(&dir.path().join("disk.sock"), None, "rbd-replay-qsd");
    stop_cleanly(qsd);
    let dir = tempfile::tempdir().unwrap();
    let program = env!("CARGO_BIN_EXE_aio-storage-daemon");
    let daemon = blockdev_daemon(program, &test, &ours, dir.path());
    let our_run = replay(&dir.path().join("disk.sock"), None, "rbd-replay-ours");
    stop_cleanly(daemon);
    let sum = their_run.info("disk_sha256");
    assert!(sum.is_some(), "the guest printed no disk_sha256");
    assert_eq!(
        our_run.info("disk_sha256"),
        sum,
        "what the guest read through each daemon"
    );
    let (code, said) = qemu_img(&[
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        &test.qemu_name(&ours),
        &test.qemu_name(&theirs),
    ]);
    assert_eq!(code, Some(0), "qemu-img compare ours theirs: {said}");
}
