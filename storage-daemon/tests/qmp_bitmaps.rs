//! Block nodes that own their image, and the dirty bitmap commands on them: a qcow2 node
//! added by `blockdev-add` holds its image (and its lock) until `blockdev-del`; a bitmap
//! lives on its node across the exports that come and go, is dirtied by the writes of an NBD
//! client, and is listed, hashed, disabled, merged and cleared as qemu-storage-daemon does
//! for the same steps (the replies compared field by field, the SHA-256 of QEMU's layout
//! included).
//!
//! Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`), and `qemu-storage-daemon` for the
//! comparison (`.ci/run` installs them).

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aio_test_support::launch::{Daemon, Launch};
use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// `program` with a monitor only; its monitor client.
fn daemon(program: &str, dir: &Path) -> (Daemon, Qmp) {
    let monitor = dir.join("qmp.sock");
    let d = Launch::new(program)
        .args([
            "--chardev".to_string(),
            format!("socket,id=m,path={},server=on,wait=off", monitor.display()),
            "--monitor".to_string(),
            "m".to_string(),
        ])
        .label(program)
        .log_to(dir.join("log"))
        .socket(monitor.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let (q, _) = Qmp::connect(&monitor, false);
    (d, q)
}

/// A 64 MiB qcow2 image (64 KiB clusters) in `dir`.
fn qcow2(dir: &Path) -> PathBuf {
    let path = dir.join("disk.qcow2");
    common::qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "64M"]);
    path
}

/// Writes `len` bytes at `offset` through NBD export `name` on `socket` with `qemu-io`.
fn nbd_write(socket: &Path, name: &str, offset: u64, len: u64) {
    let uri = format!("nbd+unix:///{name}?socket={}", socket.display());
    let out = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            &format!("write -P 0x5a {offset} {len}"),
            &uri,
        ])
        .output()
        .expect("qemu-io");
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("failed"),
        "qemu-io write: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `qemu-img info`'s exit status and stderr on `image` (refused while a writer holds it).
fn qemu_img_info(image: &Path) -> (bool, String) {
    let out = Command::new("qemu-img")
        .args(["info", image.to_str().unwrap()])
        .output()
        .expect("qemu-img");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Node `node`'s `dirty-bitmaps` in `query-named-block-nodes` (null when it has none).
fn bitmaps_of(q: &mut Qmp, node: &str) -> Value {
    let nodes = q.ok("query-named-block-nodes", json!({"flat": true}));
    nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node-name"] == node)
        .unwrap_or_else(|| panic!("no node {node} in {nodes}"))["dirty-bitmaps"]
        .clone()
}

/// Bitmap `name`'s SHA-256 of QEMU's layout.
fn sha256(q: &mut Qmp, node: &str, name: &str) -> String {
    let r = q.ok(
        "x-debug-block-dirty-bitmap-sha256",
        json!({"node": node, "name": name}),
    );
    r["sha256"].as_str().unwrap().to_string()
}

/// Exports node `fmt` over NBD as `exp`.
fn export(q: &mut Qmp) {
    q.ok(
        "block-export-add",
        json!({"type": "nbd", "id": "exp", "node-name": "fmt", "name": "exp", "writable": true}),
    );
}

/// The steps run against a daemon: what each step answered (listed bitmaps, hashes, error
/// texts), to compare between daemons. Asserts what holds for both.
fn steps(program: &str) -> Vec<Value> {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let image = qcow2(dir.path());
    let nbd = dir.path().join("nbd.sock");
    let (daemon, mut q) = daemon(program, dir.path());
    let mut seen = Vec::new();
    q.ok(
        "nbd-server-start",
        json!({"addr": {"type": "unix", "data": {"path": nbd.to_str().unwrap()}}}),
    );
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "file", "filename": image.to_str().unwrap()}),
    );
    q.ok(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": "fmt", "file": "file"}),
    );
    let raw = dir.path().join("disk.raw");
    common::qemu_img(&["create", "-q", "-f", "raw", raw.to_str().unwrap(), "1M"]);
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "raw", "filename": raw.to_str().unwrap()}),
    );
    // The qcow2 node holds its image, and its write lock, from blockdev-add on.
    let (ok, stderr) = qemu_img_info(&image);
    assert!(!ok, "{program}: qemu-img info while the node exists");
    assert!(
        stderr.contains("Failed to get shared \"write\" lock"),
        "{program}: {stderr}"
    );
    seen.push(bitmaps_of(&mut q, "fmt"));

    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "b0"}),
    );
    let empty = sha256(&mut q, "fmt", "b0");
    seen.push(json!(empty));
    seen.push(bitmaps_of(&mut q, "fmt"));

    // Writes through an export dirty it; the bitmap outlives the export.
    export(&mut q);
    nbd_write(&nbd, "exp", 1 << 20, 64 << 10);
    nbd_write(&nbd, "exp", (8 << 20) + 512, 512);
    q.ok("block-export-del", json!({"id": "exp"}));
    std::thread::sleep(Duration::from_millis(200));
    let listed = bitmaps_of(&mut q, "fmt");
    assert_eq!(listed[0]["count"], 2 * 65536, "{program}: {listed}");
    seen.push(listed);
    let dirtied = sha256(&mut q, "fmt", "b0");
    assert_ne!(dirtied, empty, "{program}");
    seen.push(json!(dirtied));

    // Disabled, a write leaves it as it was; a second bitmap of 4 KiB chunks takes a merge.
    q.ok(
        "block-dirty-bitmap-disable",
        json!({"node": "fmt", "name": "b0"}),
    );
    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "b1", "granularity": 4096, "disabled": true}),
    );
    export(&mut q);
    nbd_write(&nbd, "exp", 32 << 20, 4096);
    seen.push(bitmaps_of(&mut q, "fmt"));
    assert_eq!(
        sha256(&mut q, "fmt", "b0"),
        dirtied,
        "{program}: disabled b0 changed"
    );
    q.ok(
        "block-dirty-bitmap-merge",
        json!({"node": "fmt", "target": "b1", "bitmaps": ["b0", {"node": "fmt", "name": "b0"}]}),
    );
    seen.push(json!(sha256(&mut q, "fmt", "b1")));
    seen.push(bitmaps_of(&mut q, "fmt"));
    // A merge with one unknown source changes nothing.
    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "b2"}),
    );
    let (_, missing) = q.error(
        "block-dirty-bitmap-merge",
        json!({"node": "fmt", "target": "b2", "bitmaps": ["b0", "nope"]}),
    );
    seen.push(json!(missing));
    assert_eq!(
        sha256(&mut q, "fmt", "b2"),
        empty,
        "{program}: a failed merge changed b2"
    );

    // The refusals, with QEMU's texts.
    for (command, args) in [
        (
            "block-dirty-bitmap-add",
            json!({"node": "fmt", "name": "b0"}),
        ),
        ("block-dirty-bitmap-add", json!({"node": "fmt", "name": ""})),
        (
            "block-dirty-bitmap-add",
            json!({"node": "fmt", "name": "g", "granularity": 1000}),
        ),
        (
            "block-dirty-bitmap-add",
            json!({"node": "nope", "name": "x"}),
        ),
        (
            "block-dirty-bitmap-add",
            json!({"node": "raw", "name": "p", "persistent": true}),
        ),
        (
            "block-dirty-bitmap-clear",
            json!({"node": "nope", "name": "b0"}),
        ),
        (
            "block-dirty-bitmap-remove",
            json!({"node": "fmt", "name": "zz"}),
        ),
        ("blockdev-del", json!({"node-name": "fmt"})),
        ("blockdev-del", json!({"node-name": "file"})),
    ] {
        let (class, desc) = q.error(command, args.clone());
        seen.push(json!([command, args, class, desc]));
    }

    // Cleared and removed; then the node goes, and its lock with it.
    q.ok(
        "block-dirty-bitmap-clear",
        json!({"node": "fmt", "name": "b0"}),
    );
    assert_eq!(sha256(&mut q, "fmt", "b0"), empty, "{program}: cleared");
    q.ok(
        "block-dirty-bitmap-remove",
        json!({"node": "fmt", "name": "b2"}),
    );
    seen.push(bitmaps_of(&mut q, "fmt"));
    q.ok("block-export-del", json!({"id": "exp"}));
    std::thread::sleep(Duration::from_millis(200));
    q.ok("blockdev-del", json!({"node-name": "fmt"}));
    q.ok("blockdev-del", json!({"node-name": "file"}));
    q.ok("blockdev-del", json!({"node-name": "raw"}));
    let (ok, stderr) = qemu_img_info(&image);
    assert!(ok, "{program}: qemu-img info after blockdev-del: {stderr}");
    let check = Command::new("qemu-img")
        .args(["check", image.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{program}: qemu-img check: {check:?}"
    );
    q.ok("quit", json!({}));
    let _ = daemon.stop();
    seen
}

#[test]
fn bitmaps_live_on_their_node_and_answer_as_qemu_storage_daemons_do() {
    let ours = steps(OURS);
    if !common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let theirs = steps("qemu-storage-daemon");
    assert_eq!(ours.len(), theirs.len());
    for (k, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "step {k}: ours {a} / qemu-storage-daemon's {b}");
    }
}
