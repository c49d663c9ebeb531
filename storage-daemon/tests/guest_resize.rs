//! A running Linux guest (under TCG) sees its disk resized: the daemon runs a
//! qemu-storage-daemon command line with a QMP monitor, the guest says it is ready
//! (`aio.mode=resize` in `scripts/guest-init.sh`), the test sends `block_resize`, and the
//! guest's kernel must take the new capacity from the config interrupt QEMU raises on the
//! daemon's `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` (`/sys/block/vda/size`, virtio_blk's
//! "new size" line), then write the new last MiB and read it back; the host then finds those
//! bytes in the image. A raw file, a qcow2 image and an RBD image (`driver=rbd`, in the test
//! cluster; librbd then reports the new size), each on our daemon.
//!
//! `guest_sees_qemu_storage_daemons_resize` runs the same guest against qemu-storage-daemon,
//! the reference.
//!
//! Where QEMU or the guest's packages cannot be had the tests print `skipped: <reason>` and
//! pass, unless `AIO_REQUIRE_ALL_BACKENDS=1` says nothing may be skipped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;
#[path = "guest/harness.rs"]
#[allow(dead_code)] // shared with the other guest tests
mod harness;
#[path = "common/qmp.rs"]
mod qmp_client;

use aio_conformance::skip;
use aio_test_support::launch::Launch;
use harness::{guest_image, run_guest, runnable, GuestSpec};
use qmp_client::Qmp;
use serde_json::json;

const MIB: u64 = 1 << 20;
/// The disk's size at boot.
const BEFORE: u64 = 64 * MIB;
/// Its size after `block_resize`.
const AFTER: u64 = 128 * MIB;
const QUEUES: u32 = 2;
/// One guest at a time: two TCG guests on a two-CPU machine slow each other past their limits.
static GUESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// The checks of `aio.mode=resize`, in its order.
const RESIZE_CHECKS: &[&str] = &[
    "vda",
    "size",
    "serial",
    "queues",
    "resize-seen",
    "capacity-logged",
    "end-write",
    "end-readback",
];

/// A qemu-storage-daemon command line exporting `image` (`format`) on `socket`, with a
/// monitor on `monitor`.
fn command_line(image: &Path, format: &str, socket: &Path, monitor: &Path) -> Vec<String> {
    let nodes = match format {
        // `image` is `rbd:POOL/IMAGE:conf=PATH`.
        "rbd" => {
            let name = image.to_str().unwrap().strip_prefix("rbd:").unwrap();
            let (spec, conf) = name.split_once(":conf=").unwrap();
            let (pool, image) = spec.split_once('/').unwrap();
            vec![format!(
                "driver=rbd,node-name=disk0,pool={pool},image={image},conf={conf},user=admin"
            )]
        }
        _ => vec![
            format!(
                "driver=file,node-name=file0,filename={},cache.direct=on",
                image.display()
            ),
            format!("driver={format},node-name=disk0,file=file0"),
        ],
    };
    let mut args: Vec<String> = nodes
        .into_iter()
        .flat_map(|n| ["--blockdev".to_string(), n])
        .collect();
    args.extend(harness::export_args(socket, QUEUES, true));
    args.extend([
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ]);
    args
}

/// The sha256 of the last MiB of `image`'s disk (a qcow2 image read through `qemu-img`).
fn last_mib_sha256(dir: &Path, image: &Path, format: &str) -> String {
    let raw = dir.join("flat.raw");
    if format == "rbd" {
        let name = image.to_str().unwrap().strip_prefix("rbd:").unwrap();
        let (spec, conf) = name.split_once(":conf=").unwrap();
        aio_rbd::testing::TestCluster::at(Path::new(conf)).rbd(&[
            "export",
            spec,
            raw.to_str().unwrap(),
        ]);
    } else {
        common::qemu_img(&[
            "convert",
            "-f",
            format,
            "-O",
            "raw",
            image.to_str().unwrap(),
            raw.to_str().unwrap(),
        ]);
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("tail -c {MIB} '{}' | sha256sum", raw.display()))
        .output()
        .expect("sh");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().unwrap_or("").to_string()
}

/// Boots the guest against `program` serving a `format` image with the command line above,
/// resizes the disk when the guest is ready, and checks what the guest and the image show.
fn resize_under_a_guest(program: &str, format: &str, name: &str) {
    let Some(guest) = guest_image() else { return };
    let _one_at_a_time = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    if !runnable("qemu-img") {
        skip("qemu-img is not installed (Debian package qemu-utils)");
        return;
    }
    let dir = aio_test_support::images::image_dir("storage-daemon-test");
    let mut image = dir.path().join(format!("disk.{format}"));
    let cluster = match format {
        "rbd" => {
            let Some(test) = aio_rbd::testing::TestCluster::get() else {
                return;
            };
            let spec = aio_rbd::testing::TestCluster::new_image(&test.connect(), "resize", BEFORE);
            image = format!("rbd:{spec}:conf={}", test.conf().display()).into();
            Some((test, spec))
        }
        _ => {
            let size = BEFORE.to_string();
            common::qemu_img(&["create", "-q", "-f", format, image.to_str().unwrap(), &size]);
            None
        }
    };
    let (socket, monitor) = (dir.path().join("disk.sock"), dir.path().join("qmp.sock"));
    let daemon = Launch::new(program)
        .args(command_line(&image, format, &socket, &monitor))
        .label(program)
        .log_to(dir.path().join("daemon.log"))
        .socket(socket.clone())
        .socket(monitor.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut qmp, _) = Qmp::connect(&monitor, false);
    let spec = GuestSpec {
        socket: &socket,
        capacity: BEFORE,
        // What qemu-storage-daemon's export answers, and ours for its command line.
        serial: Some("vhost_user_blk"),
        queues: QUEUES,
        checks: RESIZE_CHECKS,
        append: format!("aio.mode=resize aio.resize_to={AFTER}"),
        reconnect: false,
        monitor: None,
        nbd_export: None,
    };
    let mut resized = None;
    let run = run_guest(guest, &spec, name, &mut |line| {
        if line.contains("GUEST-RESIZE-READY") && resized.is_none() {
            resized = Some(qmp.call("block_resize", json!({"node-name": "disk0", "size": AFTER})));
        }
    });
    assert_eq!(
        resized,
        Some(json!({"return": {}})),
        "block_resize's reply (None: the guest never got ready); console in {}",
        run.log.display()
    );
    run.assert_passed(&spec);
    let guest_sum = run.info("end_sha256").expect("the guest's end_sha256");
    let status = daemon.stop().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{program} exited with {status}");
    assert_eq!(
        last_mib_sha256(dir.path(), &image, format),
        guest_sum,
        "the image's last MiB is what the guest wrote there"
    );
    if format == "qcow2" {
        let check = common::qemu_img(&["check", image.to_str().unwrap()]);
        assert!(check.contains("No errors were found"), "{check}");
    }
    if let Some((test, spec)) = cluster {
        let rbd = aio_rbd::RbdImage::open(&test.connect(), &spec, true).unwrap();
        assert_eq!(rbd.size().unwrap(), AFTER, "librbd reports the new size");
    }
}

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

#[test]
fn guest_sees_a_raw_disk_grow_and_uses_its_new_end() {
    resize_under_a_guest(OURS, "raw", "resize-raw");
}

#[test]
fn guest_sees_a_qcow2_disk_grow_and_uses_its_new_end() {
    resize_under_a_guest(OURS, "qcow2", "resize-qcow2");
}

#[test]
fn guest_sees_an_rbd_disk_grow_and_uses_its_new_end() {
    resize_under_a_guest(OURS, "rbd", "resize-rbd");
}

/// The reference: qemu-storage-daemon's own resize under the same guest, with the same
/// checks (a guest script that passed only with ours would prove nothing).
#[test]
fn guest_sees_qemu_storage_daemons_resize() {
    if !runnable("qemu-storage-daemon") {
        skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    resize_under_a_guest("qemu-storage-daemon", "raw", "resize-qsd");
}
