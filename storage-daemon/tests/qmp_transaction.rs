//! `transaction` of dirty bitmap actions, all or nothing, as qemu-storage-daemon does it:
//! the same steps run against both daemons and every reply compared (the bitmaps
//! `query-named-block-nodes` lists, their SHA-256 in QEMU's layout, the error texts, the
//! persistent bitmaps the qcow2 image keeps once the node is closed).
//!
//! * A checkpoint as libvirt makes one (`qemu_checkpoint.c`: the new bitmap added and the
//!   previous one disabled in one transaction), with a merge into a bitmap the same
//!   transaction adds; later writes dirty the new bitmap only.
//! * A transaction whose last action fails leaves everything as it was: its added bitmaps
//!   are gone, a bitmap it cleared keeps its bits, one it merged into or enabled is as
//!   before, one it removed is still there and usable.
//! * `abort`, an unknown action type, `completion-mode=grouped` and malformed actions get
//!   QEMU's texts; an action type QEMU knows and this daemon does not serve is refused.
//!
//! Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`), and `qemu-storage-daemon` for the
//! comparison (`.ci/run` installs them).

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;

use bitmap_steps::{bitmaps_of, export, export_del, fixture, nbd_write, sha256, Fixture};
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// A transaction action of `kind` on `data`.
fn act(kind: &str, data: Value) -> Value {
    json!({"type": kind, "data": data})
}

/// `{"node": "fmt", "name": name}`.
fn bm(name: &str) -> Value {
    json!({"node": "fmt", "name": name})
}

/// The bitmaps the qcow2 image at `image` keeps (`qemu-img info`), by name.
fn stored_bitmaps(image: &Path) -> Value {
    let info = common::qemu_img(&["info", "--output=json", image.to_str().unwrap()]);
    let info: Value = serde_json::from_str(&info).expect("qemu-img info's JSON");
    let names: Vec<Value> = info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .map(|list| list.iter().map(|b| b["name"].clone()).collect())
        .unwrap_or_default();
    Value::Array(names)
}

/// The steps run against a daemon: what each answered, to compare between daemons. Asserts
/// what holds for both.
fn steps(program: &str) -> Vec<Value> {
    let Fixture {
        dir,
        image,
        nbd,
        daemon,
        mut q,
    } = fixture(program);
    let mut seen = Vec::new();
    q.ok("block-dirty-bitmap-add", bm("b0"));
    let empty = sha256(&mut q, "fmt", "b0");
    export(&mut q);
    nbd_write(&nbd, "exp", 1 << 20, 64 << 10);
    nbd_write(&nbd, "exp", 8 << 20, 4096);
    let b0 = sha256(&mut q, "fmt", "b0");
    assert_ne!(b0, empty, "{program}: the writes dirtied b0");

    // A checkpoint: b0 disabled and c1 added, with a merge into a bitmap added beside; the
    // disable listed first, for the order of the actions must not matter.
    let r = q.call(
        "transaction",
        json!({"actions": [
            act("block-dirty-bitmap-disable", bm("b0")),
            act("block-dirty-bitmap-add", bm("c1")),
            act("block-dirty-bitmap-add",
                json!({"node": "fmt", "name": "m", "disabled": true})),
            act("block-dirty-bitmap-merge",
                json!({"node": "fmt", "target": "m", "bitmaps": ["b0", "c1"]})),
        ], "properties": {"completion-mode": "individual"}}),
    );
    assert_eq!(r, json!({"return": {}}), "{program}");
    assert_eq!(sha256(&mut q, "fmt", "m"), b0, "{program}: m has b0's bits");
    assert_eq!(
        sha256(&mut q, "fmt", "c1"),
        empty,
        "{program}: c1 starts clean"
    );
    nbd_write(&nbd, "exp", 16 << 20, 4096);
    let listed = bitmaps_of(&mut q, "fmt");
    seen.push(listed.clone());
    let count = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("{program}: no {name} in {listed}"))["count"]
            .clone()
    };
    assert_eq!(count("c1"), json!(65536), "{program}: c1 took the write");
    assert_eq!(count("b0"), json!(2 * 65536), "{program}: b0 did not");
    seen.push(json!(sha256(&mut q, "fmt", "c1")));

    // A transaction whose last action fails changes nothing: b0 not cleared, c1 not merged
    // into, x1 not added, m not removed, b0 not enabled.
    let before = bitmaps_of(&mut q, "fmt");
    let c1 = sha256(&mut q, "fmt", "c1");
    let (class, desc) = q.error(
        "transaction",
        json!({"actions": [
            act("block-dirty-bitmap-add", bm("x1")),
            act("block-dirty-bitmap-clear", bm("b0")),
            act("block-dirty-bitmap-enable", bm("b0")),
            act("block-dirty-bitmap-merge",
                json!({"node": "fmt", "target": "c1", "bitmaps": ["m"]})),
            act("block-dirty-bitmap-remove", bm("m")),
            act("block-dirty-bitmap-clear", bm("nope")),
        ]}),
    );
    seen.push(json!([class, desc]));
    assert_eq!(desc, "Dirty bitmap 'nope' not found", "{program}");
    assert_eq!(bitmaps_of(&mut q, "fmt"), before, "{program}: rolled back");
    assert_eq!(
        sha256(&mut q, "fmt", "b0"),
        b0,
        "{program}: b0 kept its bits"
    );
    assert_eq!(sha256(&mut q, "fmt", "c1"), c1, "{program}: c1 as it was");
    // m, held for its removal while the transaction ran, is usable again.
    q.ok("block-dirty-bitmap-clear", bm("m"));

    // `abort` undoes the add before it; an action after a removal of its bitmap is refused.
    for actions in [
        json!([
            act("block-dirty-bitmap-add", bm("y")),
            act("abort", json!({}))
        ]),
        json!([
            act("block-dirty-bitmap-remove", bm("m")),
            act("block-dirty-bitmap-clear", bm("m"))
        ]),
        json!([
            act("block-dirty-bitmap-remove", bm("m")),
            act("block-dirty-bitmap-add", bm("m"))
        ]),
        json!([
            act("block-dirty-bitmap-add", bm("d")),
            act("block-dirty-bitmap-add", bm("d"))
        ]),
        json!([act("block-dirty-bitmap-add", bm("b0"))]),
    ] {
        let (class, desc) = q.error("transaction", json!({ "actions": actions }));
        seen.push(json!([actions, class, desc]));
    }
    seen.push(bitmaps_of(&mut q, "fmt"));

    // The last enable or disable of a bitmap wins; a bitmap added, merged into and removed
    // in one transaction is gone; an empty transaction does nothing.
    q.ok(
        "transaction",
        json!({"actions": [
            act("block-dirty-bitmap-enable", bm("b0")),
            act("block-dirty-bitmap-disable", bm("b0")),
            act("block-dirty-bitmap-disable", bm("c1")),
            act("block-dirty-bitmap-enable", bm("c1")),
            act("block-dirty-bitmap-add", bm("t")),
            act("block-dirty-bitmap-merge",
                json!({"node": "fmt", "target": "t", "bitmaps": ["b0"]})),
            act("block-dirty-bitmap-remove", bm("t")),
        ]}),
    );
    q.ok("transaction", json!({"actions": []}));
    seen.push(bitmaps_of(&mut q, "fmt"));

    // Malformed transactions, with QEMU's texts.
    for args in [
        json!({}),
        json!({"actions": {}}),
        json!({"actions": [3]}),
        json!({"actions": [], "colour": 1}),
        json!({"actions": [{"type": "nope", "data": {}}]}),
        json!({"actions": [{"data": {}}]}),
        json!({"actions": [{"type": "abort"}]}),
        json!({"actions": [{"type": "abort", "data": {"x": 1}}]}),
        json!({"actions": [{"type": "abort", "data": {}, "x": 1}]}),
        json!({"actions": [act("block-dirty-bitmap-add", json!({"node": "fmt"}))]}),
        json!({"actions": [act("block-dirty-bitmap-add", json!({"node": "fmt", "name": 3}))]}),
        json!({"actions": [act("block-dirty-bitmap-clear", json!({"node": "fmt", "name": "b0", "z": 1}))]}),
        json!({"actions": [act("block-dirty-bitmap-add", bm("g"))],
               "properties": {"completion-mode": "grouped"}}),
        json!({"actions": [act("block-dirty-bitmap-add", bm("g"))],
               "properties": {"completion-mode": "bogus"}}),
        json!({"actions": [act("block-dirty-bitmap-add", bm("g")), act("abort", json!({}))],
               "properties": {"completion-mode": "grouped"}}),
    ] {
        let (class, desc) = q.error("transaction", args.clone());
        seen.push(json!([args, class, desc]));
    }

    // A backup whose target does not exist: QEMU's text, the add before it undone.
    let (class, desc) = q.error(
        "transaction",
        json!({"actions": [
            act("block-dirty-bitmap-add", bm("z")),
            act("blockdev-backup", json!({"device": "fmt", "target": "nope", "sync": "full"})),
        ]}),
    );
    seen.push(json!([class, desc]));
    seen.push(bitmaps_of(&mut q, "fmt"));
    // An action QEMU serves and this daemon does not yet: refused (QEMU's error is about its
    // arguments, ours says it is not served), the add before it undone.
    let (class, desc) = q.error(
        "transaction",
        json!({"actions": [
            act("block-dirty-bitmap-add", bm("z")),
            act("blockdev-snapshot", json!({"node": "fmt", "overlay": "nope"})),
        ]}),
    );
    seen.push(json!(class));
    if program == OURS {
        assert_eq!(
            desc,
            "Action 'blockdev-snapshot' is not served in a transaction by aio-storage-daemon yet"
        );
    }
    seen.push(bitmaps_of(&mut q, "fmt"));

    // Persistent bitmaps: one removed by a transaction is gone from the image once the node
    // is closed, one whose removal was rolled back is kept.
    for name in ["p1", "p2"] {
        q.ok(
            "block-dirty-bitmap-add",
            json!({"node": "fmt", "name": name, "persistent": true}),
        );
    }
    q.ok(
        "transaction",
        json!({"actions": [act("block-dirty-bitmap-remove", bm("p1"))]}),
    );
    let (_, desc) = q.error(
        "transaction",
        json!({"actions": [act("block-dirty-bitmap-remove", bm("p2")), act("abort", json!({}))]}),
    );
    assert_eq!(desc, "Transaction aborted using Abort action", "{program}");
    seen.push(bitmaps_of(&mut q, "fmt"));

    // A bitmap of an image opened read-only may be disabled and enabled (QEMU's
    // BDRV_BITMAP_ALLOW_RO), not cleared or removed.
    let ro = dir.path().join("ro.qcow2");
    common::qemu_img(&["create", "-q", "-f", "qcow2", ro.to_str().unwrap(), "1M"]);
    common::qemu_img(&["bitmap", "--add", ro.to_str().unwrap(), "r"]);
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "rofile", "filename": ro.to_str().unwrap(),
               "read-only": true}),
    );
    q.ok(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": "ro", "file": "rofile", "read-only": true}),
    );
    let r = json!({"node": "ro", "name": "r"});
    for kind in [
        "block-dirty-bitmap-disable",
        "block-dirty-bitmap-enable",
        "block-dirty-bitmap-clear",
        "block-dirty-bitmap-remove",
    ] {
        let reply = q.call("transaction", json!({"actions": [act(kind, r.clone())]}));
        let allowed = kind.ends_with("able");
        assert_eq!(
            reply.get("return").is_some(),
            allowed,
            "{program}: {kind}: {reply}"
        );
        seen.push(reply);
    }
    seen.push(bitmaps_of(&mut q, "ro"));
    q.ok("blockdev-del", json!({"node-name": "ro"}));
    q.ok("blockdev-del", json!({"node-name": "rofile"}));

    export_del(&mut q, "exp");
    q.ok("blockdev-del", json!({"node-name": "fmt"}));
    q.ok("blockdev-del", json!({"node-name": "file"}));
    let stored = stored_bitmaps(&image);
    assert_eq!(stored, json!(["p2"]), "{program}");
    seen.push(stored);
    q.ok("quit", json!({}));
    let _ = daemon.stop();
    seen
}

#[test]
fn transactions_of_bitmap_actions_are_all_or_nothing_as_qemu_storage_daemons_are() {
    bitmap_steps::same_as_qemu_storage_daemon(OURS, steps);
}
