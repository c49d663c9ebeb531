//! `blockdev-backup` (push mode) and the `block-job-*` verbs, run against this daemon and
//! qemu-storage-daemon with the same steps, their replies and each job's events
//! (`JOB_STATUS_CHANGE`, `BLOCK_JOB_COMPLETED`, `BLOCK_JOB_CANCELLED`, in order, with their
//! data) compared:
//!
//! * a full backup held back by its speed limit while a client overwrites a range it has not
//!   copied yet: the target holds the old data (`qemu-img compare` with an image of what the
//!   disk held at the start), the disk the new;
//! * an incremental backup (`sync=incremental`) copies only the bitmap's range and leaves the
//!   bitmap with the writes made since; a checkpoint and a full backup in one transaction
//!   (libvirt's push-mode start);
//! * a cancel (`BLOCK_JOB_CANCELLED`), `query-block-jobs`, `block-job-set-speed`, the verbs'
//!   refusals, and every argument check QEMU makes, with its texts;
//! * the targets clean in `qemu-img check`.
//!
//! A job is waited for by its events, never by sleeping. Needs `qemu-img` and `qemu-io`, and
//! `qemu-storage-daemon` for the comparison (Debian's `qemu-utils`).

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;
use std::process::Command;

use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
const MIB: u64 = 1 << 20;

/// Writes `pattern` at `offset` (`len` bytes) into `image` or an NBD URI with `qemu-io`.
fn qemu_io(target: &str, format: &str, pattern: u8, offset: u64, len: u64) {
    let out = Command::new("qemu-io")
        .args(["-f", format, "-c"])
        .arg(format!("write -P {pattern} {offset} {len}"))
        .arg(target)
        .output()
        .expect("qemu-io");
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("failed"),
        "qemu-io: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A 64 MiB qcow2 target `name` in `dir`, added as node `name`.
fn target(q: &mut Qmp, dir: &Path, name: &str) -> String {
    let path = dir
        .join(format!("{name}.qcow2"))
        .to_str()
        .unwrap()
        .to_string();
    common::qemu_img(&["create", "-q", "-f", "qcow2", &path, "64M"]);
    let file = format!("{name}-file");
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": file, "filename": path}),
    );
    q.ok(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": name, "file": file}),
    );
    path
}

/// Whether `qemu-img compare` finds `a` and `b` equal (the text it printed when not).
fn compare(a: &str, b: &str) -> Value {
    let out = Command::new("qemu-img")
        .args(["compare", "-U", a, b])
        .output()
        .expect("qemu-img");
    match out.status.success() {
        true => json!("identical"),
        false => json!(String::from_utf8_lossy(&out.stdout).to_string()),
    }
}

fn check_clean(image: &str) {
    let out = Command::new("qemu-img")
        .args(["check", "-U", image])
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "qemu-img check {image}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The argument checks, in QEMU's order, with its texts.
fn refusals(q: &mut Qmp) -> Vec<Value> {
    let b = |extra: Value| {
        let mut args = json!({"job-id": "r", "device": "fmt", "target": "t1", "sync": "full"});
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        args
    };
    let cases = [
        json!({"job-id": null}),
        json!({"device": "nope"}),
        json!({"target": "nope"}),
        json!({"target": "fmt"}),
        json!({"sync": "incremental"}),
        json!({"sync": "bitmap"}),
        json!({"sync": "incremental", "bitmap": "b", "bitmap-mode": "never"}),
        json!({"sync": "bitmap", "bitmap": "none-such", "bitmap-mode": "never"}),
        json!({"bitmap": "b"}),
        json!({"bitmap": "b", "bitmap-mode": "never"}),
        json!({"sync": "none", "bitmap": "b", "bitmap-mode": "always"}),
        json!({"bitmap-mode": "always"}),
        json!({"sync": "sideways"}),
        json!({"speed": -1}),
        json!({"job-id": "1x"}),
    ];
    let mut seen = Vec::new();
    for case in cases {
        let mut args = b(case);
        args.as_object_mut().unwrap().retain(|_, v| !v.is_null());
        seen.push(q.call("blockdev-backup", args));
    }
    for (verb, key) in [
        ("block-job-set-speed", "device"),
        ("block-job-cancel", "device"),
        ("block-job-pause", "device"),
        ("block-job-finalize", "id"),
    ] {
        let mut args = json!({ key: "nope" });
        if verb == "block-job-set-speed" {
            args["speed"] = json!(0);
        }
        seen.push(q.call(verb, args));
    }
    seen
}

/// The steps run against `program`: what each answered.
fn steps(program: &str) -> Vec<Value> {
    let mut f = bitmap_steps::fixture(program);
    let d = f.dir.path().to_path_buf();
    let q = &mut f.q;
    bitmap_steps::export(q);
    let uri = format!("nbd+unix:///exp?socket={}", f.nbd.display());
    qemu_io(&uri, "raw", 0x5a, 0, MIB);
    qemu_io(&uri, "raw", 0x5a, 10 * MIB, 64 << 10);
    let at_start = d.join("start.qcow2").to_str().unwrap().to_string();
    common::qemu_img(&["create", "-q", "-f", "qcow2", &at_start, "64M"]);
    qemu_io(&at_start, "qcow2", 0x5a, 0, MIB);
    qemu_io(&at_start, "qcow2", 0x5a, 10 * MIB, 64 << 10);
    let mut seen = Vec::new();
    let t1 = target(q, &d, "t1");
    q.ok(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": "b"}),
    );
    seen.extend(refusals(q));

    // A full backup held back by its speed (it copies its first MiB, then waits), the disk
    // overwritten where it has not copied yet, then let go.
    seen.push(q.call(
        "blockdev-backup",
        json!({"job-id": "full", "device": "fmt", "target": "t1", "sync": "full",
               "speed": 1000}),
    ));
    let mut listed = q.ok("query-block-jobs", json!({}));
    listed[0]["busy"] = json!("(timing)");
    listed[0]["offset"] = json!("(timing)");
    seen.push(listed);
    seen.push(q.call(
        "blockdev-backup",
        json!({"job-id": "full", "device": "fmt",
        "target": "t1", "sync": "full"}),
    ));
    qemu_io(&uri, "raw", 0x77, 10 * MIB, 4096);
    seen.push(q.call("block-job-set-speed", json!({"device": "full", "speed": 0})));
    seen.push(json!(bitmap_steps::job_events(q, "full", "null")));

    // The incremental since `b`: the bitmap holds the two first writes and the overwrite.
    let t2 = target(q, &d, "t2");
    qemu_io(&uri, "raw", 0x66, 30 * MIB, 4096);
    seen.push(bitmap_steps::bitmaps_of(q, "fmt"));
    seen.push(q.call(
        "blockdev-backup",
        json!({"job-id": "inc", "device": "fmt", "target": "t2", "sync": "incremental",
               "bitmap": "b", "auto-dismiss": false}),
    ));
    seen.push(json!(bitmap_steps::job_events(q, "inc", "concluded")));
    seen.push(q.ok("query-jobs", json!({})));
    seen.push(q.call("job-dismiss", json!({"id": "inc"})));
    seen.push(bitmap_steps::bitmaps_of(q, "fmt"));

    // libvirt's push-mode start: a new checkpoint and a full backup in one transaction; then
    // a backup cancelled while its speed holds it.
    let t3 = target(q, &d, "t3");
    seen.push(q.call(
        "transaction",
        json!({"actions": [
            {"type": "block-dirty-bitmap-add", "data": {"node": "fmt", "name": "c1",
                                                        "persistent": true}},
            {"type": "blockdev-backup", "data": {"job-id": "tx", "device": "fmt",
                                                 "target": "t3", "sync": "full"}},
        ]}),
    ));
    seen.push(json!(bitmap_steps::job_events(q, "tx", "null")));
    seen.push(q.call(
        "blockdev-backup",
        json!({"job-id": "slow", "device": "fmt", "target": "t3", "sync": "full",
               "speed": 1000}),
    ));
    seen.push(q.call("job-cancel", json!({"id": "slow"})));
    seen.push(json!(bitmap_steps::job_events(q, "slow", "null")));
    seen.push(bitmap_steps::bitmaps_of(q, "fmt"));
    seen.push(q.ok("quit", json!({})));
    let exited = f.daemon.wait_exit(std::time::Duration::from_secs(20));
    assert!(
        exited.is_some_and(|s| s.success()),
        "{program} after quit: {exited:?}"
    );
    // The incremental holds the bitmap's chunks only: the overwrite and the later write, and
    // nothing at 0 (written before the bitmap).
    for (at, byte) in [
        (0, 0),
        (10 * MIB, 0x77),
        (10 * MIB + 4096, 0x5a),
        (30 * MIB, 0x66),
    ] {
        let out = Command::new("qemu-io")
            .args(["-r", "-f", "qcow2", "-c"])
            .arg(format!("read -P {byte} {at} 4096"))
            .arg(&t2)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success() && !text.contains("Pattern verification failed"),
            "{program}: the incremental at {at}: {text}"
        );
    }
    for t in [&t1, &t2, &t3] {
        check_clean(t);
    }
    seen.push(compare(&at_start, &t1));
    seen
}

#[test]
fn backups_answer_as_qemu_storage_daemon_and_hold_the_disk_at_their_start() {
    let ours = steps(OURS);
    assert_eq!(ours.last(), Some(&json!("identical")), "{ours:#?}");
    bitmap_steps::same_as_qemu_storage_daemon(OURS, |program| match program {
        OURS => ours.clone(),
        other => steps(other),
    });
}
