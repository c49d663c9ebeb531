//! QEMU 10.0's handover of an image between two daemons (`tests/qsd-migrate`'s shape): the
//! destination opens the qcow2 image inactive (`active=off`) and exports it with
//! `allow-inactive=on`; the source is set inactive (`blockdev-set-active active=false`), the
//! destination active; what the source wrote is read on the destination, and each side
//! refuses what an inactive image refuses, with QEMU's texts.
//!
//! Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`).

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aio_test_support::launch::{Daemon, Launch};
use qmp_client::Qmp;
use serde_json::json;

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// A daemon serving `image` (qcow2) over NBD as node `disk-fmt`, `active=off` when
/// `inactive`, with a monitor; its NBD socket and monitor.
fn daemon(dir: &Path, name: &str, image: &Path, inactive: bool) -> (Daemon, PathBuf, Qmp) {
    let (nbd, monitor) = (
        dir.join(format!("{name}-nbd.sock")),
        dir.join(format!("{name}-qmp.sock")),
    );
    let active = if inactive { ",active=off" } else { "" };
    let args = [
        "--blockdev".to_string(),
        format!(
            "file,node-name=disk-file,filename={}{active}",
            image.display()
        ),
        "--blockdev".to_string(),
        format!("qcow2,file=disk-file,node-name=disk-fmt{active}"),
        "--nbd-server".to_string(),
        format!("addr.type=unix,addr.path={}", nbd.display()),
        "--export".to_string(),
        "nbd,id=exp0,node-name=disk-fmt,writable=true,allow-inactive=true".to_string(),
        "--chardev".to_string(),
        format!("socket,id=m,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "m".to_string(),
    ];
    let d = Launch::new(OURS)
        .args(args)
        .label(name)
        .log_to(dir.join(format!("{name}.log")))
        .socket(nbd.clone())
        .socket(monitor.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let (q, _) = Qmp::connect(&monitor, false);
    (d, nbd, q)
}

/// `qemu-io` over the NBD export at `socket`: its exit status and output.
fn qemu_io(socket: &Path, command: &str) -> (bool, String) {
    let uri = format!("nbd+unix:///disk-fmt?socket={}", socket.display());
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", command, &uri])
        .output()
        .expect("qemu-io (install qemu-utils)");
    let text = aio_test_support::tool::text(&out);
    (out.status.success() && !text.contains("failed"), text)
}

fn active_of(q: &mut Qmp, node: &str) -> bool {
    let nodes = q.ok("query-named-block-nodes", json!({"flat": true}));
    let n = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node-name"] == node)
        .unwrap_or_else(|| panic!("{node} in {nodes}"));
    n["active"].as_bool().expect("an active field")
}

#[test]
fn a_qcow2_image_is_handed_over_between_two_daemons_as_qemu_does() {
    let dir = tempfile::tempdir().unwrap();
    let image = aio_test_support::images::qcow2_image(dir.path(), "disk.qcow2", "16M");
    let (src, src_nbd, mut qs) = daemon(dir.path(), "src", &image, false);
    let (dst, dst_nbd, mut qd) = daemon(dir.path(), "dst", &image, true);
    assert!(active_of(&mut qs, "disk-fmt") && active_of(&mut qs, "disk-file"));
    assert!(!active_of(&mut qd, "disk-fmt") && !active_of(&mut qd, "disk-file"));

    // The source writes (a cluster the destination's metadata does not have yet); the
    // inactive destination reads, and refuses a write as QEMU does.
    assert!(qemu_io(&src_nbd, "write -P 0x11 1M 64k").0);
    let (ok, text) = qemu_io(&dst_nbd, "write -P 0x33 0 4k");
    assert!(!ok && text.contains("Operation not permitted"), "{text}");
    assert!(qemu_io(&dst_nbd, "read 0 4k").0);

    // The destination cannot take the image while the source holds its locks.
    let (_, desc) = qd.error("blockdev-set-active", json!({"active": true}));
    assert!(desc.contains("Failed to get \"write\" lock"), "{desc}");
    assert!(!active_of(&mut qd, "disk-fmt"));

    // The handover: the source lets go, the destination takes over and sees what was written.
    assert_eq!(
        qs.ok("blockdev-set-active", json!({"active": false})),
        json!({})
    );
    assert!(!active_of(&mut qs, "disk-fmt") && !active_of(&mut qs, "disk-file"));
    assert!(
        qemu_io(&src_nbd, "read -P 0x11 1M 64k").0,
        "the source still reads"
    );
    assert_eq!(
        qd.ok("blockdev-set-active", json!({"active": true})),
        json!({})
    );
    assert!(active_of(&mut qd, "disk-fmt") && active_of(&mut qd, "disk-file"));
    let (ok, text) = qemu_io(&dst_nbd, "read -P 0x11 1M 64k");
    assert!(ok, "the destination reads the source's write: {text}");
    assert!(qemu_io(&dst_nbd, "write -P 0x22 0 4k").0);
    let (ok, text) = qemu_io(&src_nbd, "write -P 0x44 0 4k");
    assert!(!ok && text.contains("Operation not permitted"), "{text}");

    // QEMU's texts for what is refused.
    let (_, desc) = qs.error(
        "blockdev-set-active",
        json!({"node-name": "nope", "active": true}),
    );
    assert_eq!(desc, "Failed to find node with node-name='nope'");
    let (_, desc) = qs.error("blockdev-set-active", json!({"node-name": "disk-fmt"}));
    assert_eq!(desc, "Parameter 'active' is missing");

    drop(qs);
    drop(qd);
    assert!(src.stop().unwrap().success());
    assert!(dst.stop().unwrap().success());
    let out = Command::new("qemu-img")
        .args(["check", image.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        aio_test_support::tool::text(&out)
    );
    let (ok, text) = {
        let out = Command::new("qemu-io")
            .args([
                "-f",
                "qcow2",
                "-r",
                "-c",
                "read -P 0x22 0 4k",
                "-c",
                "read -P 0x11 1M 64k",
            ])
            .arg(&image)
            .output()
            .unwrap();
        (out.status.success(), aio_test_support::tool::text(&out))
    };
    assert!(ok && !text.contains("failed"), "{text}");
}

#[test]
fn an_export_without_allow_inactive_keeps_its_node_active() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let monitor = dir.path().join("qmp.sock");
    let nbd = dir.path().join("nbd.sock");
    let d = Launch::new(OURS)
        .args([
            "--blockdev".to_string(),
            format!("file,node-name=f,filename={},active=off", image.display()),
            "--nbd-server".to_string(),
            format!("addr.type=unix,addr.path={}", nbd.display()),
            "--export".to_string(),
            "nbd,id=e,node-name=f,writable=on".to_string(),
            "--chardev".to_string(),
            format!("socket,id=m,path={},server=on,wait=off", monitor.display()),
            "--monitor".to_string(),
            "chardev=m".to_string(),
        ])
        .label("ours")
        .socket(monitor.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut q, _) = Qmp::connect(&monitor, false);
    // The export activated its node (QEMU's bdrv_activate for an export without
    // allow-inactive), and keeps it so.
    assert!(active_of(&mut q, "f"));
    let (_, desc) = q.error(
        "blockdev-set-active",
        json!({"node-name": "f", "active": false}),
    );
    assert_eq!(desc, "Failed to inactivate node: Operation not permitted");
    let (_, desc) = q.error("blockdev-set-active", json!({"active": false}));
    assert_eq!(
        desc,
        "Failed to inactivate all nodes: Operation not permitted"
    );
    assert!(active_of(&mut q, "f"));
    drop(q);
    assert!(d.stop().unwrap().success());
}

#[test]
fn an_export_added_without_allow_inactive_activates_the_node_others_serve_inactive() {
    let dir = tempfile::tempdir().unwrap();
    let image = aio_test_support::images::qcow2_image(dir.path(), "disk.qcow2", "16M");
    let (d, nbd, mut q) = daemon(dir.path(), "one", &image, true);
    let (ok, text) = qemu_io(&nbd, "write -P 0x55 0 4k");
    assert!(!ok && text.contains("Operation not permitted"), "{text}");
    let added = json!({"type": "nbd", "id": "e2", "node-name": "disk-fmt", "name": "second",
                       "writable": true});
    assert_eq!(q.ok("block-export-add", added), json!({}));
    assert!(active_of(&mut q, "disk-fmt") && active_of(&mut q, "disk-file"));
    // The image both exports share is active now: the first export writes too.
    assert!(qemu_io(&nbd, "write -P 0x55 0 4k").0);
    drop(q);
    assert!(d.stop().unwrap().success());
}
