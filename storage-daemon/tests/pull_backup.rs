//! libvirt's pull-mode backup (`src/qemu/qemu_backup.c`), step by step, against this daemon
//! and qemu-storage-daemon, every reply and the backup job's events compared:
//!
//! 1. a disk (qcow2 node `fmt`, exported writable as `exp`) with a checkpoint bitmap `c0`;
//! 2. the scratch qcow2 image, its backing the disk's node (`backing: fmt`);
//! 3. one `transaction`: the new checkpoint `c1`, the backup's bitmap `backup-bm` (disabled,
//!    `c0` merged into it), `c0` disabled, and `blockdev-backup sync=none` into the scratch
//!    node (copy-before-write: the fleecing image);
//! 4. the scratch node exported read-only over NBD with `bitmaps: [backup-bm]`, found on the
//!    disk's node down the scratch's backing, as QEMU finds it;
//! 5. the disk overwritten through `exp`, where the export had data and where it had none;
//! 6. the export read with `qemu-img convert`: byte for byte the disk at the checkpoint
//!    (`qemu-img compare` with an image of it); `nbdinfo --map=qemu:dirty-bitmap:backup-bm`
//!    shows what was written since `c0`, as qemu-storage-daemon's does;
//! 7. teardown: export removed, job cancelled (`BLOCK_JOB_CANCELLED`), scratch nodes deleted,
//!    the backup's bitmap removed; after `quit` both checkpoints are in `qemu-img info`.
//!
//! Needs `qemu-img`, `qemu-io` and `nbdinfo` (`scripts/lib.sh` installs libnbd-bin), and
//! `qemu-storage-daemon` for the comparison.

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::process::Command;

use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
const MIB: u64 = 1 << 20;

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn write(target: &str, format: &str, pattern: u8, offset: u64, len: u64) {
    let out = run(
        "qemu-io",
        &[
            "-f",
            format,
            "-c",
            &format!("write -P {pattern} {offset} {len}"),
            target,
        ],
    );
    assert!(!out.contains("failed"), "{out}");
}

/// Job `id`'s events until it is gone, drain pauses folded (see `qmp_backup.rs`).
fn job_events(q: &mut Qmp, id: &str) -> Vec<Value> {
    q.wait_event(|e| {
        e["event"] == "JOB_STATUS_CHANGE" && e["data"]["id"] == id && e["data"]["status"] == "null"
    });
    let mut mine: Vec<Value> = Vec::new();
    for e in q.events.drain(..) {
        let of_job = e["data"]["id"] == id || e["data"]["device"] == id;
        if !of_job || !e["event"].as_str().is_some_and(|n| n.contains("JOB")) {
            continue;
        }
        let mut e = json!({"event": e["event"], "data": e["data"]});
        if e["event"] == "BLOCK_JOB_CANCELLED" {
            // What the writes copied before the cancel: QEMU and this daemon copy in chunks
            // of their own.
            e["data"]["offset"] = json!("(copied)");
        }
        let status = |e: &Value| e["data"]["status"].as_str().map(str::to_string);
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

/// The steps against `program`: what each answered.
fn steps(program: &str) -> Vec<Value> {
    let mut f = bitmap_steps::fixture(program);
    let d = f.dir.path().to_path_buf();
    let path = |name: &str| d.join(name).to_str().unwrap().to_string();
    let disk = f.image.to_str().unwrap().to_string();
    let q = &mut f.q;
    let mut seen = Vec::new();
    bitmap_steps::export(q);
    let exp = format!("nbd+unix:///exp?socket={}", f.nbd.display());
    write(&exp, "raw", 0x5a, 0, MIB);
    write(&exp, "raw", 0x5a, 10 * MIB, 64 << 10);
    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "c0", "persistent": true}),
    );
    write(&exp, "raw", 0x33, 20 * MIB, 4096);
    // The disk at the checkpoint, as the backup must give it back.
    let at_checkpoint = path("checkpoint.qcow2");
    run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", &at_checkpoint, "64M"],
    );
    write(&at_checkpoint, "qcow2", 0x5a, 0, MIB);
    write(&at_checkpoint, "qcow2", 0x5a, 10 * MIB, 64 << 10);
    write(&at_checkpoint, "qcow2", 0x33, 20 * MIB, 4096);

    // The scratch image, backed by the disk (its header names it; the node is the backing).
    let scratch = path("scratch.qcow2");
    run(
        "qemu-img",
        &[
            "create", "-q", "-f", "qcow2", "-u", "-b", &disk, "-F", "qcow2", &scratch, "64M",
        ],
    );
    seen.push(q.call(
        "blockdev-add",
        json!({"driver": "file", "node-name": "scratch-file", "filename": scratch}),
    ));
    seen.push(q.call(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": "scratch", "file": "scratch-file",
               "backing": "fmt"}),
    ));
    let act = |kind: &str, data: Value| json!({"type": kind, "data": data});
    seen.push(q.call(
        "transaction",
        json!({"actions": [
            act("block-dirty-bitmap-add", json!({"node": "fmt", "name": "c1", "persistent": true})),
            act("block-dirty-bitmap-add", json!({"node": "fmt", "name": "backup-bm",
                                                  "persistent": false, "disabled": true})),
            act("block-dirty-bitmap-merge", json!({"node": "fmt", "target": "backup-bm",
                                                    "bitmaps": ["c0"]})),
            act("block-dirty-bitmap-disable", json!({"node": "fmt", "name": "c0"})),
            act("blockdev-backup", json!({"job-id": "fleece", "device": "fmt",
                                          "target": "scratch", "sync": "none"})),
        ]}),
    ));
    seen.push(q.call(
        "block-export-add",
        json!({"type": "nbd", "id": "bexp", "node-name": "scratch", "name": "backup",
               "writable": false, "bitmaps": ["backup-bm"]}),
    ));
    // The guest writes on: over data, over a hole, over the range dirty since c0.
    write(&exp, "raw", 0x77, 10 * MIB, 4096);
    write(&exp, "raw", 0x88, 40 * MIB, 4096);
    write(&exp, "raw", 0x99, 20 * MIB, 512);

    let backup = format!("nbd+unix:///backup?socket={}", f.nbd.display());
    let copy = path("backup.raw");
    run(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &backup, &copy],
    );
    let same = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "qcow2", &copy, &at_checkpoint])
        .output()
        .unwrap();
    seen.push(json!([
        "compare",
        same.status.success(),
        String::from_utf8_lossy(&same.stdout).to_string()
    ]));
    seen.push(json!(run(
        "nbdinfo",
        &["--map=qemu:dirty-bitmap:backup-bm", &backup]
    )));
    seen.push(bitmap_steps::bitmaps_of(q, "fmt"));

    // Teardown, as libvirt ends the backup.
    bitmap_steps::export_del(q, "bexp");
    seen.push(q.call("job-cancel", json!({"id": "fleece"})));
    seen.push(json!(job_events(q, "fleece")));
    seen.push(q.call("blockdev-del", json!({"node-name": "fmt"})));
    seen.push(q.call("blockdev-del", json!({"node-name": "scratch"})));
    seen.push(q.call("blockdev-del", json!({"node-name": "scratch-file"})));
    seen.push(q.call(
        "block-dirty-bitmap-remove",
        json!({"node": "fmt", "name": "backup-bm"}),
    ));
    seen.push(bitmap_steps::bitmaps_of(q, "fmt"));
    q.ok("quit", json!({}));
    let exited = f.daemon.wait_exit(std::time::Duration::from_secs(20));
    assert!(
        exited.is_some_and(|s| s.success()),
        "{program} after quit: {exited:?}"
    );
    let info: Value =
        serde_json::from_str(&run("qemu-img", &["info", "--output=json", &disk])).unwrap();
    // By name: the directory's order means nothing (QEMU writes its newest first, this
    // daemon keeps a stored bitmap's place).
    let mut stored = info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    stored.sort_by_key(|b| b["name"].as_str().unwrap_or_default().to_string());
    seen.push(json!(stored));
    run("qemu-img", &["check", "-q", &disk]);
    seen
}

#[test]
fn libvirts_pull_backup_runs_unchanged_and_serves_the_disk_as_it_was() {
    if !aio_test_support::tool::installed("nbdinfo") {
        aio_conformance::skip("nbdinfo is not installed (Debian package libnbd-bin)");
        return;
    }
    let ours = steps(OURS);
    let compared = ours
        .iter()
        .find(|v| v[0] == "compare")
        .expect("the compare step");
    assert_eq!(
        compared[1], true,
        "the backup is not the disk at the checkpoint: {compared}"
    );
    bitmap_steps::same_as_qemu_storage_daemon(OURS, |program| match program {
        OURS => ours.clone(),
        other => steps(other),
    });
}
