//! The steps the dirty bitmap and backup tests share (`qmp_bitmaps`, `qmp_transaction`,
//! `qmp_backup`, `pull_backup`): a daemon with
//! a monitor only, a qcow2 image, writes through an NBD export with `qemu-io`, and a node's
//! bitmaps as `query-named-block-nodes` and `x-debug-block-dirty-bitmap-sha256` show them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aio_test_support::launch::{Daemon, Launch};
use serde_json::{json, Value};

use crate::qmp_client::Qmp;

/// `program` with a monitor only; its monitor client.
pub fn daemon(program: &str, dir: &Path) -> (Daemon, Qmp) {
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

/// What the bitmap tests' steps start from: `program` with a monitor only, in a directory of
/// `/dev/shm` holding a 64 MiB qcow2 image, node `fmt` (qcow2) over node `file` on it, and the
/// NBD server started on `nbd` (`qcow2_node`).
pub struct Fixture {
    /// The directory (removed when dropped).
    pub dir: tempfile::TempDir,
    /// The qcow2 image.
    pub image: PathBuf,
    /// The NBD server's socket.
    pub nbd: PathBuf,
    /// The daemon.
    pub daemon: Daemon,
    /// Its monitor.
    pub q: Qmp,
}

/// The [`Fixture`] on `program`.
pub fn fixture(program: &str) -> Fixture {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let image = qcow2(dir.path());
    let nbd = dir.path().join("nbd.sock");
    let (daemon, mut q) = daemon(program, dir.path());
    qcow2_node(&mut q, &image, &nbd);
    Fixture {
        dir,
        image,
        nbd,
        daemon,
        q,
    }
}

/// A 64 MiB qcow2 image (64 KiB clusters) in `dir`.
pub fn qcow2(dir: &Path) -> PathBuf {
    let path = dir.join("disk.qcow2");
    crate::common::qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "64M"]);
    path
}

/// Writes `len` bytes at `offset` through NBD export `name` on `socket` with `qemu-io`.
pub fn nbd_write(socket: &Path, name: &str, offset: u64, len: u64) {
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

/// Node `node`'s `dirty-bitmaps` in `query-named-block-nodes` (null when it has none).
pub fn bitmaps_of(q: &mut Qmp, node: &str) -> Value {
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
pub fn sha256(q: &mut Qmp, node: &str, name: &str) -> String {
    let r = q.ok(
        "x-debug-block-dirty-bitmap-sha256",
        json!({"node": node, "name": name}),
    );
    r["sha256"].as_str().unwrap().to_string()
}

/// Exports node `fmt` over NBD as `exp`.
pub fn export(q: &mut Qmp) {
    q.ok(
        "block-export-add",
        json!({"type": "nbd", "id": "exp", "node-name": "fmt", "name": "exp", "writable": true}),
    );
}

/// Starts the NBD server on `nbd` and adds `image` as node `fmt` (qcow2) over node `file`.
pub fn qcow2_node(q: &mut Qmp, image: &Path, nbd: &Path) {
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
}

/// `block-export-del` of export `id`, then waits for its `BLOCK_EXPORT_DELETED` (the export
/// is gone, its node free for `blockdev-del`, on either daemon).
pub fn export_del(q: &mut Qmp, id: &str) {
    q.ok("block-export-del", json!({ "id": id }));
    q.wait_event(|e| e["event"] == "BLOCK_EXPORT_DELETED" && e["data"]["id"] == id);
}

/// Runs `steps` against our daemon (`ours`) and qemu-storage-daemon and asserts that every
/// step answered the same (qemu-storage-daemon missing: said loudly, ours still run).
pub fn same_as_qemu_storage_daemon(ours: &str, steps: impl Fn(&str) -> Vec<Value>) {
    let ours = steps(ours);
    if !crate::common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let theirs = steps("qemu-storage-daemon");
    assert_eq!(ours.len(), theirs.len());
    for (k, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "step {k}: ours {a} / qemu-storage-daemon's {b}");
    }
}

/// Reads events until job `id`'s `JOB_STATUS_CHANGE` to `last` (`null`, `concluded`); returns
/// the job's events in order (names and data), what depends on timing or on the copy's
/// chunking written as such (a cancelled job's offset) and drain pauses folded.
pub fn job_events(q: &mut Qmp, id: &str, last: &str) -> Vec<Value> {
    let ends = |e: &Value| {
        e["event"] == "JOB_STATUS_CHANGE" && e["data"]["id"] == id && e["data"]["status"] == last
    };
    q.wait_event(ends);
    let mut mine: Vec<Value> = Vec::new();
    let status = |e: &Value| e["data"]["status"].as_str().map(str::to_string);
    for e in q.events.drain(..) {
        let of_job = e["data"]["id"] == id || e["data"]["device"] == id;
        if !of_job || !e["event"].as_str().is_some_and(|n| n.contains("JOB")) {
            continue;
        }
        // A `paused` then `running` is a drain of the node (QEMU pauses a job at every
        // drain of its nodes: at its start, at another command's prepare, at an NBD
        // client's connection; this daemon drains nothing and shows only the start's):
        // folded, so the sequences compare what a job does.
        let mut e = json!({"event": e["event"], "data": e["data"]});
        if e["event"] == "BLOCK_JOB_CANCELLED" {
            // Where the copy was when the cancel came.
            e["data"]["offset"] = json!("(timing)");
        }
        if status(&e).as_deref() == Some("running")
            && mine.last().and_then(status).as_deref() == Some("paused")
        {
            mine.pop();
            continue;
        }
        mine.push(e);
    }
    mine
}

/// Runs `program` with `args`, which must succeed; its output.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Writes into `image` (a qcow2 overlay made here over `previous`, the image restored from
/// the backup before) the dirty ranges of `map` (`nbdinfo --map` of the backup's bitmap)
/// read from `copy` (the export read whole): the increment rebased on the backup before.
pub fn restore_increment(map: &str, copy: &str, previous: &str, image: &str) {
    run(
        "qemu-img",
        &[
            "create", "-q", "-f", "qcow2", "-b", previous, "-F", "qcow2", image,
        ],
    );
    let bytes = std::fs::read(copy).unwrap();
    let piece = format!("{image}.piece");
    for line in map.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [offset, len, kind, ..] = fields[..] else {
            continue;
        };
        if kind != "1" {
            continue;
        }
        let (offset, len): (usize, usize) = (offset.parse().unwrap(), len.parse().unwrap());
        std::fs::write(&piece, &bytes[offset..offset + len]).unwrap();
        let cmd = format!("write -s {piece} {offset} {len}");
        run("qemu-io", &["-f", "qcow2", "-c", &cmd, image]);
    }
}
