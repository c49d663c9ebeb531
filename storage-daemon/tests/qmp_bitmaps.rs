//! Block nodes that own their image, and the dirty bitmap commands on them: a qcow2 node
//! added by `blockdev-add` holds its image (and its lock) until `blockdev-del`; a bitmap
//! lives on its node across the exports that come and go, is dirtied by the writes of an NBD
//! client, and is listed, hashed, disabled, merged and cleared as qemu-storage-daemon does
//! for the same steps (the replies compared field by field, the SHA-256 of QEMU's layout
//! included).
//!
//! Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`), and `qemu-storage-daemon` for the
//! comparison (`.ci/run` installs them).

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;
use std::process::Command;

use bitmap_steps::{bitmaps_of, export, export_del, fixture, nbd_write, sha256, Fixture};
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

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

/// The steps run against a daemon: what each step answered (listed bitmaps, hashes, error
/// texts), to compare between daemons. Asserts what holds for both.
fn steps(program: &str) -> Vec<Value> {
    let Fixture {
        dir,
        image,
        nbd,
        daemon,
        mut q,
    } = fixture(program);
    let mut seen = Vec::new();
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
    export_del(&mut q, "exp");
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
    export_del(&mut q, "exp");
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
    bitmap_steps::same_as_qemu_storage_daemon(OURS, steps);
}
