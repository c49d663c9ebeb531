//! Dirty bitmaps served over NBD (`qemu:dirty-bitmap:NAME`), as qemu-storage-daemon serves
//! them: the same steps against both daemons, what each answered compared. A qcow2 node gets
//! bitmaps, writes through an NBD export dirty them, then exports serve them
//! (`block-export-add` `bitmaps`, `nbd-server-add` `bitmap`, `--export ...,bitmaps.0=`):
//! `nbdinfo --map=qemu:dirty-bitmap:NAME`, the contexts `nbdinfo --list` shows, a list of
//! `qemu:dirty-bitmap:` (one answer for one bitmap, as oVirt's client expects), the bitmaps'
//! `busy` while exported, and QEMU's refusals (unknown, enabled on a read-only export, busy,
//! inconsistent; a served bitmap cannot be removed, cleared or enabled).
//!
//! Needs `qemu-img`, `qemu-io`, `nbdinfo`, `nbdsh` and `qemu-storage-daemon`.

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;
use std::time::Duration;

use aio_test_support::launch::Launch;
use aio_test_support::tool::run;
use bitmap_steps::{bitmaps_of, fixture, nbd_write, qcow2, Fixture};
use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// The URI of export `name` on `socket`.
fn uri(socket: &Path, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", socket.display())
}

/// `nbdinfo --map=qemu:dirty-bitmap:BITMAP` of export `name`.
fn map(socket: &Path, name: &str, bitmap: &str) -> Value {
    let context = format!("--map=qemu:dirty-bitmap:{bitmap}");
    json!(run("nbdinfo", &[&context, &uri(socket, name)]))
}

/// The metadata contexts `nbdinfo --list` shows for each export (the lines under
/// `contexts:`; the block sizes and the rest are the daemons' own).
fn listed_contexts(socket: &Path) -> Value {
    let u = format!("nbd+unix:///?socket={}", socket.display());
    let out = run("nbdinfo", &["--list", &u]);
    let mut exports: Vec<Vec<String>> = Vec::new();
    let mut inside = false;
    for line in out.lines() {
        if line.starts_with("export=") {
            exports.push(vec![line.to_string()]);
            inside = false;
        } else if line.trim() == "contexts:" {
            inside = true;
        } else if inside && line.starts_with("\t\t") {
            if let Some(e) = exports.last_mut() {
                e.push(line.trim().to_string());
            }
        } else {
            inside = false;
        }
    }
    json!(exports)
}

/// The answers to `NBD_OPT_LIST_META_CONTEXT` of export `name` with `queries`.
fn list_meta(socket: &Path, name: &str, queries: &[&str]) -> Value {
    let script = format!(
        r#"
h.set_opt_mode(True)
h.connect_uri({uri:?})
for q in {queries:?}:
    h.add_meta_context(q)
seen = []
n = h.opt_list_meta_context(lambda name: seen.append(name))
assert n == len(seen), (n, seen)
print("\n".join(seen))
h.opt_abort()
"#,
        uri = uri(socket, name),
    );
    let out = run("nbdsh", &["-c", &script]);
    json!(out.lines().collect::<Vec<_>>())
}

/// Waits for `BLOCK_EXPORT_DELETED` of export `id` (QEMU lets an export's bitmaps go when
/// it is deleted, which it announces).
fn deleted(q: &mut Qmp, id: &str) {
    let gone = |e: &Value| e["event"] == "BLOCK_EXPORT_DELETED" && e["data"]["id"] == id;
    loop {
        if let Some(at) = q.events.iter().position(gone) {
            q.events.remove(at);
            return;
        }
        let v = q.line().expect("BLOCK_EXPORT_DELETED");
        if v.get("event").is_some() {
            q.events.push(v);
        }
    }
}

/// `block-export-add` of an NBD export `id` of node `node` with `bitmaps`.
fn export_args(id: &str, node: &str, writable: bool, bitmaps: Value) -> Value {
    json!({"type": "nbd", "id": id, "node-name": node, "name": id,
           "writable": writable, "bitmaps": bitmaps})
}

/// A qcow2 image `name` in `dir` with persistent bitmap `bitmap` found inconsistent (left
/// `in_use` by a `qemu-io` that died holding it writable).
fn inconsistent_image(dir: &Path, name: &str, bitmap: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let p = path.to_str().unwrap();
    common::qemu_img(&["create", "-q", "-f", "qcow2", p, "1M"]);
    common::qemu_img(&["bitmap", "--add", p, bitmap]);
    let out = std::process::Command::new("qemu-io")
        .args(["-c", "write 0 4096", "-c", "sigraise 9", p])
        .output()
        .expect("qemu-io");
    assert!(!out.status.success(), "qemu-io was to die: {out:?}");
    path
}

/// The QMP steps against `program`: what each answered.
fn steps(program: &str) -> Vec<Value> {
    let Fixture {
        dir,
        image: _,
        nbd,
        daemon,
        mut q,
    } = fixture(program);
    let mut seen = Vec::new();

    // b0 sees every write, b1 only the last.
    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "b0"}),
    );
    q.ok("block-export-add", export_args("w", "fmt", true, json!([])));
    nbd_write(&nbd, "w", 1 << 20, 64 << 10);
    nbd_write(&nbd, "w", (8 << 20) + 512, 512);
    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "b1", "granularity": 4096}),
    );
    nbd_write(&nbd, "w", 32 << 20, 4096);
    q.ok_once_clients_gone("block-export-del", json!({"id": "w"}));
    deleted(&mut q, "w");
    q.ok(
        "block-dirty-bitmap-disable",
        json!({"node": "fmt", "name": "b0"}),
    );

    // The refusals of an export's bitmaps, in QEMU's words.
    let external = |node: &str, name: &str| json!([{"node": node, "name": name}]);
    for (writable, bitmaps) in [
        (false, json!(["b1"])),
        (false, json!(["b0", "nope"])),
        (true, external("nope", "b0")),
        (true, external("fmt", "zz")),
    ] {
        let args = export_args("r", "fmt", writable, bitmaps);
        seen.push(json!(q.error("block-export-add", args)));
    }
    // A disabled bitmap on a read-only export, an enabled one on a writable export.
    q.ok(
        "block-export-add",
        export_args("r", "fmt", false, json!(["b0"])),
    );
    q.ok(
        "block-export-add",
        export_args("rw", "fmt", true, external("fmt", "b1")),
    );
    seen.push(map(&nbd, "r", "b0"));
    seen.push(map(&nbd, "rw", "b1"));
    seen.push(listed_contexts(&nbd));
    seen.push(list_meta(&nbd, "r", &["qemu:dirty-bitmap:"]));
    seen.push(list_meta(&nbd, "r", &["qemu:"]));
    seen.push(list_meta(
        &nbd,
        "r",
        &["qemu:dirty-bitmap:b0", "qemu:dirty-bitmap:b1"],
    ));
    seen.push(bitmaps_of(&mut q, "fmt"));

    // A served bitmap is busy.
    for (command, args) in [
        (
            "block-export-add",
            export_args("r2", "fmt", false, json!(["b0"])),
        ),
        (
            "block-dirty-bitmap-remove",
            json!({"node": "fmt", "name": "b0"}),
        ),
        (
            "block-dirty-bitmap-enable",
            json!({"node": "fmt", "name": "b0"}),
        ),
        (
            "block-dirty-bitmap-clear",
            json!({"node": "fmt", "name": "b1"}),
        ),
        (
            "nbd-server-add",
            json!({"device": "fmt", "name": "legacy", "bitmap": "b1"}),
        ),
        (
            "nbd-server-add",
            json!({"device": "fmt", "name": "legacy", "bitmap": "b1", "writable": true}),
        ),
        ("nbd-server-add", json!({"device": "nope", "bitmap": "b1"})),
    ] {
        seen.push(json!([command, q.error(command, args)]));
    }

    // Once the export is gone, so is the hold.
    q.ok_once_clients_gone("block-export-del", json!({"id": "rw"}));
    deleted(&mut q, "rw");
    q.ok(
        "nbd-server-add",
        json!({"device": "fmt", "name": "legacy", "bitmap": "b1", "writable": true}),
    );
    seen.push(map(&nbd, "legacy", "b1"));
    q.ok_once_clients_gone("block-export-del", json!({"id": "legacy"}));
    deleted(&mut q, "legacy");
    q.ok(
        "block-dirty-bitmap-clear",
        json!({"node": "fmt", "name": "b1"}),
    );
    q.ok_once_clients_gone("block-export-del", json!({"id": "r"}));
    deleted(&mut q, "r");
    q.ok(
        "block-dirty-bitmap-remove",
        json!({"node": "fmt", "name": "b0"}),
    );
    seen.push(bitmaps_of(&mut q, "fmt"));

    // An inconsistent bitmap is not served.
    let inc = inconsistent_image(dir.path(), "inc.qcow2", "inc");
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "incfile", "filename": inc.to_str().unwrap()}),
    );
    q.ok(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": "inc", "file": "incfile"}),
    );
    let args = export_args("i", "inc", true, json!(["inc"]));
    seen.push(json!(q.error("block-export-add", args)));

    q.ok("quit", json!({}));
    let _ = daemon.stop();
    seen
}

/// `program` started with a command line export serving persistent bitmap `pb` of a qcow2
/// image that `qemu-io` wrote before: the map of it, or the daemon's refusal.
fn command_line(program: &str, disable: bool) -> Value {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let image = qcow2(dir.path());
    let p = image.to_str().unwrap();
    common::qemu_img(&["bitmap", "--add", p, "pb"]);
    run(
        "qemu-io",
        &["-c", "write 4M 192K", "-c", "write 40M 512", p],
    );
    if disable {
        common::qemu_img(&["bitmap", "--disable", p, "pb"]);
    }
    let nbd = dir.path().join("nbd.sock");
    let args = [
        "--blockdev".to_string(),
        format!("driver=file,node-name=file,filename={p}"),
        "--blockdev".to_string(),
        "driver=qcow2,node-name=fmt,file=file".to_string(),
        "--nbd-server".to_string(),
        format!("addr.type=unix,addr.path={}", nbd.display()),
        "--export".to_string(),
        "type=nbd,id=e,node-name=fmt,name=e,bitmaps.0=pb".to_string(),
    ];
    if !disable {
        let child = std::process::Command::new(program)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the daemon");
        // A daemon that was not refused serves until killed: the test fails, not hangs.
        let out = common::ended_within(child, Duration::from_secs(20));
        assert!(
            !out.status.success(),
            "{program} served an enabled bitmap read-only"
        );
        let text = String::from_utf8_lossy(&out.stderr);
        let said = text.contains("Enabled bitmap 'pb' incompatible with readonly export");
        assert!(said, "{program}: {text}");
        return json!(said);
    }
    let d = Launch::new(program)
        .args(args)
        .label(program)
        .log_to(dir.path().join("log"))
        .socket(nbd.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let seen = map(&nbd, "e", "pb");
    let _ = d.stop();
    seen
}

#[test]
fn bitmaps_are_served_and_refused_as_qemu_storage_daemon_serves_them() {
    bitmap_steps::same_as_qemu_storage_daemon(OURS, steps);
}

#[test]
fn a_command_line_export_serves_a_persistent_bitmap_as_qemu_storage_daemon_does() {
    let ours = [command_line(OURS, true), command_line(OURS, false)];
    if !common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let theirs = [
        command_line("qemu-storage-daemon", true),
        command_line("qemu-storage-daemon", false),
    ];
    assert_eq!(ours, theirs);
}
