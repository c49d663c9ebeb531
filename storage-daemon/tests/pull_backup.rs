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

use bitmap_steps::run;
use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
const MIB: u64 = 1 << 20;

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

/// The writes of round `round` (the first at a checkpoint's start, the rest during its
/// backup): over data, over a hole, over what the round before wrote.
fn writes(round: u64) -> [(u8, u64, u64); 3] {
    let p = 0x30 + round as u8 * 0x10;
    [
        (p, (10 + round) * MIB, 4096),
        (p + 1, (40 + 3 * round) * MIB, 8192),
        (p + 2, (20 + round) * MIB + 512, 512),
    ]
}

/// One backup of libvirt's pull mode, round `round` (0: full, then incremental since the
/// checkpoint of the round before): the transaction, the scratch node and its export, the
/// guest's writes during it, the teardown. The export is restored into `restored{round}`
/// (round 0: all of it; then only the bitmap's ranges, over the round before's image), which
/// must equal `at_checkpoint`. Returns what each step answered.
fn pull_round(q: &mut Qmp, f: &Paths, round: u64, at_checkpoint: &str) -> Vec<Value> {
    let since: Vec<String> = (round > 0)
        .then(|| format!("c{}", round - 1))
        .into_iter()
        .collect();
    let base = (round > 0).then(|| f.path(&format!("restored{}.qcow2", round - 1)));
    pull_since(q, f, round, &since, base.as_deref(), at_checkpoint)
}

/// [`pull_round`] of round `round`, incremental since the checkpoints `since` (merged into
/// the backup's bitmap, the last disabled; none: a full backup), restored over `base`.
fn pull_since(
    q: &mut Qmp,
    f: &Paths,
    round: u64,
    since: &[String],
    base: Option<&str>,
    at_checkpoint: &str,
) -> Vec<Value> {
    let restored = &f.path(&format!("restored{round}.qcow2"));
    let mut seen = Vec::new();
    let scratch = f.path(&format!("scratch{round}.qcow2"));
    run(
        "qemu-img",
        &[
            "create", "-q", "-f", "qcow2", "-u", "-b", &f.disk, "-F", "qcow2", &scratch, "64M",
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
    let mut actions = vec![act(
        "block-dirty-bitmap-add",
        json!({"node": "fmt", "name": format!("c{round}"), "persistent": true}),
    )];
    let incremental = !since.is_empty();
    if let Some(last) = since.last() {
        actions.extend([
            act(
                "block-dirty-bitmap-add",
                json!({"node": "fmt", "name": "backup-bm",
                                                  "persistent": false, "disabled": true}),
            ),
            act(
                "block-dirty-bitmap-merge",
                json!({"node": "fmt", "target": "backup-bm",
                                                    "bitmaps": since}),
            ),
            act(
                "block-dirty-bitmap-disable",
                json!({"node": "fmt", "name": last}),
            ),
        ]);
    }
    actions.push(act(
        "blockdev-backup",
        json!({"job-id": "fleece", "device": "fmt", "target": "scratch", "sync": "none"}),
    ));
    seen.push(q.call("transaction", json!({ "actions": actions })));
    let mut export = json!({"type": "nbd", "id": "bexp", "node-name": "scratch",
                            "name": "backup", "writable": false});
    if incremental {
        export["bitmaps"] = json!(["backup-bm"]);
    }
    seen.push(q.call("block-export-add", export));
    // The guest writes on during the backup.
    for (pattern, offset, len) in writes(round + 1) {
        write(&f.exp, "raw", pattern, offset, len);
    }

    let backup = format!("nbd+unix:///backup?socket={}", f.nbd);
    let copy = f.path(&format!("backup{round}.raw"));
    run(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &backup, &copy],
    );
    if incremental {
        let map = run("nbdinfo", &["--map=qemu:dirty-bitmap:backup-bm", &backup]);
        seen.push(json!(map));
        bitmap_steps::restore_increment(&map, &copy, base.expect("a base"), restored);
    } else {
        run(
            "qemu-img",
            &["convert", "-f", "raw", "-O", "qcow2", &copy, restored],
        );
    }
    let same = Command::new("qemu-img")
        .args(["compare", "-U", restored, at_checkpoint])
        .output()
        .unwrap();
    seen.push(json!([
        "compare",
        round,
        same.status.success(),
        String::from_utf8_lossy(&same.stdout).to_string()
    ]));
    seen.push(bitmap_steps::bitmaps_of(q, "fmt"));

    // Teardown, as libvirt ends the backup.
    bitmap_steps::export_del(q, "bexp");
    seen.push(q.call("job-cancel", json!({"id": "fleece"})));
    seen.push(json!(bitmap_steps::job_events(q, "fleece", "null")));
    seen.push(q.call("blockdev-del", json!({"node-name": "fmt"})));
    seen.push(q.call("blockdev-del", json!({"node-name": "scratch"})));
    seen.push(q.call("blockdev-del", json!({"node-name": "scratch-file"})));
    if incremental {
        seen.push(q.call(
            "block-dirty-bitmap-remove",
            json!({"node": "fmt", "name": "backup-bm"}),
        ));
    }
    seen
}

/// Where one run's files are.
struct Paths {
    dir: std::path::PathBuf,
    disk: String,
    exp: String,
    nbd: String,
}

impl Paths {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }
}

/// The steps against `program`: what each answered.
fn steps(program: &str) -> Vec<Value> {
    let mut f = bitmap_steps::fixture(program);
    let paths = Paths {
        dir: f.dir.path().to_path_buf(),
        disk: f.image.to_str().unwrap().to_string(),
        exp: format!("nbd+unix:///exp?socket={}", f.nbd.display()),
        nbd: f.nbd.display().to_string(),
    };
    let q = &mut f.q;
    let mut seen = Vec::new();
    bitmap_steps::export(q);
    // The disk, and beside it a model receiving the same writes: copied at each checkpoint.
    let model = paths.path("model.qcow2");
    run("qemu-img", &["create", "-q", "-f", "qcow2", &model, "64M"]);
    let both = |pattern: u8, offset: u64, len: u64| {
        write(&paths.exp, "raw", pattern, offset, len);
        write(&model, "qcow2", pattern, offset, len);
    };
    both(0x5a, 0, MIB);
    both(0x5a, 10 * MIB, 64 << 10);
    for round in 0..3 {
        let at_checkpoint = paths.path(&format!("checkpoint{round}.qcow2"));
        std::fs::copy(&model, &at_checkpoint).unwrap();
        seen.extend(pull_round(q, &paths, round, &at_checkpoint));
        // What the guest wrote during the backup is in the model after the checkpoint.
        for (pattern, offset, len) in writes(round + 1) {
            write(&model, "qcow2", pattern, offset, len);
        }
    }
    q.ok("quit", json!({}));
    let exited = f.daemon.wait_exit(std::time::Duration::from_secs(20));
    assert!(
        exited.is_some_and(|s| s.success()),
        "{program} after quit: {exited:?}"
    );
    let info: Value =
        serde_json::from_str(&run("qemu-img", &["info", "--output=json", &paths.disk])).unwrap();
    // By name: the directory's order means nothing (QEMU writes its newest first, this
    // daemon keeps a stored bitmap's place).
    let mut stored = info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    stored.sort_by_key(|b| b["name"].as_str().unwrap_or_default().to_string());
    seen.push(json!(stored));
    run("qemu-img", &["check", "-q", &paths.disk]);
    seen
}

#[test]
fn libvirts_pull_backups_full_then_incremental_restore_the_disk_at_each_checkpoint() {
    if !aio_test_support::tool::installed("nbdinfo") {
        aio_conformance::skip("nbdinfo is not installed (Debian package libnbd-bin)");
        return;
    }
    let ours = steps(OURS);
    let compared: Vec<&Value> = ours.iter().filter(|v| v[0] == "compare").collect();
    assert_eq!(compared.len(), 3, "three backups");
    for c in compared {
        assert_eq!(
            c[2], true,
            "a backup restored is not the disk at its checkpoint: {c}"
        );
    }
    bitmap_steps::same_as_qemu_storage_daemon(OURS, |program| match program {
        OURS => ours.clone(),
        other => steps(other),
    });
}

/// Beyond qemu-storage-daemon (which leaves every persistent bitmap `in-use` after a SIGKILL,
/// and the next incremental backup refused): our daemon is killed in the middle of a pull
/// backup, with the guest writing; the image's checkpoints come back consistent, and the
/// next incremental backup (since the last good checkpoint, both bitmaps merged) restored
/// over the full one equals the disk.
#[test]
fn after_a_sigkill_mid_backup_the_next_incremental_is_correct() {
    if !aio_test_support::tool::installed("nbdinfo") {
        aio_conformance::skip("nbdinfo is not installed (Debian package libnbd-bin)");
        return;
    }
    let mut f = bitmap_steps::fixture(OURS);
    let dir = f.dir.path().to_path_buf();
    let paths = |nbd: &std::path::Path| Paths {
        dir: dir.clone(),
        disk: f.image.to_str().unwrap().to_string(),
        exp: format!("nbd+unix:///exp?socket={}", nbd.display()),
        nbd: nbd.display().to_string(),
    };
    let first = paths(&f.nbd);
    let model = first.path("model.qcow2");
    run("qemu-img", &["create", "-q", "-f", "qcow2", &model, "64M"]);
    let both = |p: &Paths, (pattern, offset, len): (u8, u64, u64)| {
        write(&p.exp, "raw", pattern, offset, len);
        write(&model, "qcow2", pattern, offset, len);
    };
    bitmap_steps::export(&mut f.q);
    both(&first, (0x5a, 0, MIB));
    let at0 = first.path("checkpoint0.qcow2");
    std::fs::copy(&model, &at0).unwrap();
    let full = pull_round(&mut f.q, &first, 0, &at0);
    assert!(
        full.iter().any(|v| v[0] == "compare" && v[2] == true),
        "{full:?}"
    );
    for w in writes(1) {
        write(&model, "qcow2", w.0, w.1, w.2);
    }

    // The next backup starts (checkpoint c1, c0 disabled), the guest writes, the daemon dies.
    let scratch = first.path("scratch1.qcow2");
    run(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-u",
            "-b",
            &first.disk,
            "-F",
            "qcow2",
            &scratch,
            "64M",
        ],
    );
    let q = &mut f.q;
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "scratch-file", "filename": scratch}),
    );
    q.ok(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": "scratch", "file": "scratch-file",
               "backing": "fmt"}),
    );
    q.ok(
        "transaction",
        json!({"actions": [
            {"type": "block-dirty-bitmap-add",
             "data": {"node": "fmt", "name": "c1", "persistent": true}},
            {"type": "block-dirty-bitmap-disable", "data": {"node": "fmt", "name": "c0"}},
            {"type": "blockdev-backup", "data": {"job-id": "fleece", "device": "fmt",
                                                 "target": "scratch", "sync": "none"}},
        ]}),
    );
    for w in writes(2) {
        both(&first, w);
    }
    f.daemon.kill();
    let info: Value = serde_json::from_str(&run(
        "qemu-img",
        &["info", "-U", "--output=json", &first.disk],
    ))
    .unwrap();
    let stored = info["format-specific"]["data"]["bitmaps"].clone();
    let names: Vec<&str> = stored
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{stored}");
    assert!(
        !stored.to_string().contains("in-use"),
        "consistent: {stored}"
    );

    // Started again: the incremental since c0 (c0 and c1 merged) over the full backup.
    let (_daemon, mut q) = bitmap_steps::daemon(OURS, &dir);
    let nbd = dir.join("nbd-again.sock");
    bitmap_steps::qcow2_node(&mut q, &f.image, &nbd);
    bitmap_steps::export(&mut q);
    let again = paths(&nbd);
    let at2 = again.path("checkpoint2.qcow2");
    std::fs::copy(&model, &at2).unwrap();
    let base = again.path("restored0.qcow2");
    let since = ["c0".to_string(), "c1".to_string()];
    let incremental = pull_since(&mut q, &again, 2, &since, Some(&base), &at2);
    let compared = incremental.iter().find(|v| v[0] == "compare").unwrap();
    assert_eq!(compared[2], true, "{compared}");
}
