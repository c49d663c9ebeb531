//! A running guest's disk backed up while the guest writes and verifies: libvirt's pull mode
//! (`src/qemu/qemu_backup.c`: a checkpoint transaction, a scratch qcow2 node over the disk,
//! `blockdev-backup sync=none`, the scratch exported over NBD with the backup's bitmap), one
//! full then two incremental backups, then its push mode (`sync=incremental` into a qcow2
//! target), two incrementals more: five checkpoints in a row.
//!
//! The guest (`aio.mode=backup` in `vhost-user-blk/scripts/guest-init.sh`) runs fio passes of
//! random writes with crc32c verify on both queues, new data each pass, and prints a line at
//! the end of each; the test takes one step of the backups at each line, so the guest has
//! written between every two checkpoints and during every backup, whatever the machine's
//! speed. At each checkpoint the VM is paused (`stop` on QEMU's monitor: the device's rings
//! are stopped) for as long as the transaction runs (draining the node) and the disk is read
//! into a reference copy, then continued. Each backup restored (the full one with
//! `qemu-img convert`, an increment's dirty ranges written over the backup before, a push
//! target over the backup before as its backing) must equal the reference byte for byte.
//! When the backups are done the test writes the guest's stop mark through the daemon's
//! NBD export of the disk; the guest's fio passes must all have passed, and after a clean
//! stop the image holds the five checkpoints, none `in-use`.
//!
//! `guest_backups_on_qemu_storage_daemon` runs the same steps against qemu-storage-daemon,
//! the reference (steps that passed only with ours would prove nothing).
//!
//! Where QEMU or the guest's packages cannot be had the tests print `skipped: <reason>` and
//! pass, unless `AIO_REQUIRE_ALL_BACKENDS=1` says nothing may be skipped.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "guest/harness.rs"]
#[allow(dead_code)] // shared with the other guest tests
mod harness;
#[path = "common/qmp.rs"]
mod qmp_client;

use aio_conformance::skip;
use aio_test_support::launch::Launch;
use bitmap_steps::run;
use harness::{guest_image, run_guest, runnable, GuestSpec};
use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
const MIB: u64 = 1 << 20;
/// The disk's size; the guest's fio writes its first 2 x 8 MiB.
const CAPACITY: u64 = 128 * MIB;
const QUEUES: u32 = 2;
/// Checkpoints 0..PULL are pull-mode backups (0 full), then PUSH push-mode incrementals.
const PULL: u64 = 3;
const PUSH: u64 = 2;
/// One guest at a time: two TCG guests on a two-CPU machine slow each other past their limits.
static GUESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
const BACKUP_CHECKS: &[&str] = &[
    "vda",
    "size",
    "serial",
    "queues",
    "fio-backup",
    "no-io-errors",
];

/// qemu-storage-daemon's command line: the qcow2 image as node `disk0` over `file0`, exported
/// over vhost-user-blk to the guest and over NBD as `exp` (the test's reads and the stop
/// mark), and a QMP monitor.
fn command_line(image: &Path, dir: &Path) -> Vec<String> {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut args = vec![
        "--blockdev".to_string(),
        format!("driver=file,node-name=file0,filename={}", image.display()),
        "--blockdev".to_string(),
        "driver=qcow2,node-name=disk0,file=file0".to_string(),
        "--nbd-server".to_string(),
        format!("addr.type=unix,addr.path={}", path("nbd.sock")),
        "--export".to_string(),
        "type=nbd,id=exp,node-name=disk0,name=exp,writable=on".to_string(),
    ];
    args.extend(harness::export_args(&dir.join("disk.sock"), QUEUES, true));
    args.extend([
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", path("qmp.sock")),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ]);
    args
}

/// Sends `command` to QEMU's human monitor at `socket` and returns once it has answered
/// (its next prompt): `stop` has then stopped the VM and its devices.
fn hmp(socket: &Path, command: &str) {
    let mut stream = UnixStream::connect(socket).expect("QEMU's monitor");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let mut prompts_for = |stream: &mut UnixStream, want: usize, seen: &mut String| {
        while seen.matches("(qemu)").count() < want {
            let n = stream.read(&mut buf).expect("QEMU's monitor answers");
            assert!(n > 0, "QEMU's monitor closed: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    };
    prompts_for(&mut stream, 1, &mut seen);
    stream.write_all(format!("{command}\n").as_bytes()).unwrap();
    prompts_for(&mut stream, 2, &mut seen);
}

/// The backups' state between the guest's passes.
struct Backups {
    dir: PathBuf,
    q: Qmp,
    /// QEMU's human monitor.
    hmp: PathBuf,
    /// The next checkpoint.
    next: u64,
    /// The backup of this checkpoint is running (its export or its job).
    open: Option<u64>,
    /// Per checkpoint: restored equal to the disk at it, and the `qemu-img compare` output.
    compared: Vec<(u64, bool, String)>,
    /// Per incremental backup: the bytes its bitmap marked dirty.
    dirty: Vec<u64>,
    stop_sent: bool,
}

impl Backups {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.path("nbd.sock"))
    }

    /// Adds the qcow2 image at `path` as node `node` (over file node `{node}-file`), its
    /// backing `backing` (a node's name, or null: none).
    fn add_qcow2_node(&mut self, node: &str, path: &str, backing: Value) {
        let file = format!("{node}-file");
        self.q.ok(
            "blockdev-add",
            json!({"driver": "file", "node-name": file, "filename": path}),
        );
        self.q.ok(
            "blockdev-add",
            json!({"driver": "qcow2", "node-name": node, "file": file, "backing": backing}),
        );
    }

    /// Deletes what [`Backups::add_qcow2_node`] added.
    fn del_qcow2_node(&mut self, node: &str) {
        self.q.ok("blockdev-del", json!({ "node-name": node }));
        self.q
            .ok("blockdev-del", json!({"node-name": format!("{node}-file")}));
    }

    /// At each end of a guest's fio pass: ends the running backup, starts the next one, or,
    /// once all are done, writes the guest's stop mark.
    fn on_pass(&mut self) {
        if let Some(k) = self.open.take() {
            if k < PULL {
                self.end_pull(k);
            } else {
                self.end_push(k);
            }
        }
        if self.next < PULL + PUSH {
            let k = self.next;
            self.next += 1;
            self.checkpoint(k);
            self.open = Some(k);
        } else if !self.stop_sent {
            self.stop_sent = true;
            let mark = format!("write -P 0x53 {} 4096", CAPACITY - 4096);
            let out = run("qemu-io", &["-f", "raw", "-c", &mark, &self.uri("exp")]);
            assert!(!out.contains("failed"), "{out}");
        }
    }

    /// Checkpoint `k`: the VM paused, the backup's transaction (and its nodes), the disk
    /// read into `at{k}.raw`, the VM continued.
    fn checkpoint(&mut self, k: u64) {
        hmp(&self.hmp, "stop");
        let act = |kind: &str, data: Value| json!({"type": kind, "data": data});
        let mut actions = vec![act(
            "block-dirty-bitmap-add",
            json!({"node": "disk0", "name": format!("c{k}"), "persistent": true}),
        )];
        if k > 0 {
            let last = format!("c{}", k - 1);
            actions.extend([
                act(
                    "block-dirty-bitmap-add",
                    json!({"node": "disk0", "name": "backup-bm", "persistent": false,
                           "disabled": true}),
                ),
                act(
                    "block-dirty-bitmap-merge",
                    json!({"node": "disk0", "target": "backup-bm", "bitmaps": [last]}),
                ),
                act(
                    "block-dirty-bitmap-disable",
                    json!({"node": "disk0", "name": last}),
                ),
            ]);
        }
        if k < PULL {
            let scratch = self.path(&format!("scratch{k}.qcow2"));
            let disk = self.path("disk.qcow2");
            let size = CAPACITY.to_string();
            run(
                "qemu-img",
                &[
                    "create", "-q", "-f", "qcow2", "-u", "-b", &disk, "-F", "qcow2", &scratch,
                    &size,
                ],
            );
            self.add_qcow2_node("scratch", &scratch, json!("disk0"));
            actions.push(act(
                "blockdev-backup",
                json!({"job-id": "fleece", "device": "disk0", "target": "scratch",
                       "sync": "none"}),
            ));
        } else {
            // The increment's image, over the backup before (which holds what is clean).
            let target = self.path(&format!("restored{k}.qcow2"));
            let previous = self.path(&format!("restored{}.qcow2", k - 1));
            run(
                "qemu-img",
                &[
                    "create", "-q", "-f", "qcow2", "-b", &previous, "-F", "qcow2", &target,
                ],
            );
            self.add_qcow2_node("target", &target, Value::Null);
            actions.push(act(
                "blockdev-backup",
                json!({"job-id": "push", "device": "disk0", "target": "target",
                       "sync": "incremental", "bitmap": "backup-bm"}),
            ));
        }
        self.q.ok("transaction", json!({ "actions": actions }));
        if k < PULL {
            let mut export = json!({"type": "nbd", "id": "bexp", "node-name": "scratch",
                                    "name": "backup", "writable": false});
            if k > 0 {
                export["bitmaps"] = json!(["backup-bm"]);
            }
            self.q.ok("block-export-add", export);
        }
        // Read after the transaction, which drained the node: nothing the guest had sent
        // before the pause is still to land.
        let reference = self.path(&format!("at{k}.raw"));
        run(
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &self.uri("exp"),
                &reference,
            ],
        );
        hmp(&self.hmp, "cont");
    }

    /// Reads pull backup `k`'s export (while the guest writes on), restores it, compares it
    /// with the disk at its checkpoint, and tears the backup down as libvirt does.
    fn end_pull(&mut self, k: u64) {
        let copy = self.path(&format!("backup{k}.raw"));
        let restored = self.path(&format!("restored{k}.qcow2"));
        let backup = self.uri("backup");
        run(
            "qemu-img",
            &["convert", "-f", "raw", "-O", "raw", &backup, &copy],
        );
        if k == 0 {
            run(
                "qemu-img",
                &["convert", "-f", "raw", "-O", "qcow2", &copy, &restored],
            );
        } else {
            let map = run("nbdinfo", &["--map=qemu:dirty-bitmap:backup-bm", &backup]);
            self.dirty.push(dirty_bytes(&map));
            let previous = self.path(&format!("restored{}.qcow2", k - 1));
            bitmap_steps::restore_increment(&map, &copy, &previous, &restored);
        }
        self.compare(k, &restored);
        bitmap_steps::export_del(&mut self.q, "bexp");
        self.q.ok("job-cancel", json!({"id": "fleece"}));
        bitmap_steps::job_events(&mut self.q, "fleece", "null");
        self.del_qcow2_node("scratch");
        if k > 0 {
            self.q.ok(
                "block-dirty-bitmap-remove",
                json!({"node": "disk0", "name": "backup-bm"}),
            );
        }
    }

    /// Waits for push backup `k`'s job to end, compares its target (over the backup
    /// before) with the disk at its checkpoint, and removes the target's nodes.
    fn end_push(&mut self, k: u64) {
        let events = bitmap_steps::job_events(&mut self.q, "push", "null");
        let completed = events
            .iter()
            .find(|e| e["event"] == "BLOCK_JOB_COMPLETED")
            .unwrap_or_else(|| panic!("push backup {k}: {events:?}"));
        assert!(completed["data"].get("error").is_none(), "{completed}");
        self.dirty
            .push(completed["data"]["offset"].as_u64().unwrap_or_default());
        self.del_qcow2_node("target");
        self.q.ok(
            "block-dirty-bitmap-remove",
            json!({"node": "disk0", "name": "backup-bm"}),
        );
        let restored = self.path(&format!("restored{k}.qcow2"));
        run("qemu-img", &["check", "-q", &restored]);
        self.compare(k, &restored);
    }

    fn compare(&mut self, k: u64, restored: &str) {
        let reference = self.path(&format!("at{k}.raw"));
        let out = std::process::Command::new("qemu-img")
            .args(["compare", "-f", "qcow2", "-F", "raw", restored, &reference])
            .output()
            .expect("qemu-img");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        self.compared.push((k, out.status.success(), text));
    }
}

/// The bytes marked dirty in `nbdinfo --map` output.
fn dirty_bytes(map: &str) -> u64 {
    map.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields[..] {
                [_, len, "1", ..] => len.parse::<u64>().ok(),
                _ => None,
            }
        })
        .sum()
}

/// Boots the guest on `program`'s export and takes the backups while it writes.
fn backups_under_a_guest(program: &str, name: &str) {
    let Some(guest) = guest_image() else { return };
    let _one_at_a_time = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    for tool in ["qemu-img", "qemu-io", "nbdinfo"] {
        if !runnable(tool) {
            skip(&format!(
                "{tool} is not installed (scripts/lib.sh installs it)"
            ));
            return;
        }
    }
    let dir = aio_test_support::images::image_dir("storage-daemon-test");
    let image = dir.path().join("disk.qcow2");
    common::qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        image.to_str().unwrap(),
        &CAPACITY.to_string(),
    ]);
    let socket = dir.path().join("disk.sock");
    let daemon = Launch::new(program)
        .args(command_line(&image, dir.path()))
        .label(program)
        .log_to(dir.path().join("daemon.log"))
        .socket(socket.clone())
        .socket(dir.path().join("qmp.sock"))
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let (q, _) = Qmp::connect(&dir.path().join("qmp.sock"), false);
    let hmp = dir.path().join("hmp.sock");
    let mut backups = Backups {
        dir: dir.path().to_path_buf(),
        q,
        hmp: hmp.clone(),
        next: 0,
        open: None,
        compared: Vec::new(),
        dirty: Vec::new(),
        stop_sent: false,
    };
    let spec = GuestSpec {
        socket: &socket,
        capacity: CAPACITY,
        serial: Some("vhost_user_blk"),
        queues: QUEUES,
        checks: BACKUP_CHECKS,
        append: "aio.mode=backup aio.fio_size=8M aio.loops=40".to_string(),
        reconnect: false,
        monitor: Some(hmp),
        nbd_export: None,
    };
    let started = Instant::now();
    let guest_run = run_guest(guest, &spec, name, &mut |line| {
        if line.starts_with("GUEST-FIO-PASS ") {
            backups.on_pass();
        }
    });
    guest_run.assert_passed(&spec);
    println!(
        "{program}: backups under the guest in {:?}, dirty bytes per increment {:?}",
        started.elapsed(),
        backups.dirty
    );
    assert_eq!(backups.next, PULL + PUSH, "every checkpoint was taken");
    assert!(backups.open.is_none() && backups.stop_sent);
    for (k, same, text) in &backups.compared {
        assert!(
            same,
            "backup {k} restored is not the disk at its checkpoint: {text}"
        );
    }
    assert_eq!(backups.compared.len() as u64, PULL + PUSH);
    // The guest wrote between the checkpoints (each increment has data), only where its fio
    // writes (each is at most its 16 MiB, in 64 KiB clusters).
    assert_eq!(backups.dirty.len() as u64, PULL + PUSH - 1);
    for dirty in &backups.dirty {
        assert!(*dirty > 0 && *dirty <= 16 * MIB, "{:?}", backups.dirty);
    }

    backups.q.ok("quit", json!({}));
    let exited = daemon.wait_exit(Duration::from_secs(30));
    assert!(exited.is_some_and(|s| s.success()), "{program}: {exited:?}");
    let info: Value = serde_json::from_str(&run(
        "qemu-img",
        &["info", "--output=json", image.to_str().unwrap()],
    ))
    .unwrap();
    let stored = &info["format-specific"]["data"]["bitmaps"];
    let mut names: Vec<&str> = stored
        .as_array()
        .map(|b| b.iter().filter_map(|b| b["name"].as_str()).collect())
        .unwrap_or_default();
    names.sort();
    assert_eq!(names, ["c0", "c1", "c2", "c3", "c4"], "{stored}");
    assert!(!stored.to_string().contains("in-use"), "{stored}");
    run("qemu-img", &["check", "-q", image.to_str().unwrap()]);
}

#[test]
fn guest_backups_pull_then_push_restore_the_disk_at_each_of_five_checkpoints() {
    backups_under_a_guest(OURS, "backup-ours");
}

/// The reference: the same steps under the same guest on qemu-storage-daemon.
#[test]
fn guest_backups_on_qemu_storage_daemon() {
    if !runnable("qemu-storage-daemon") {
        skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    backups_under_a_guest("qemu-storage-daemon", "backup-qsd");
}
