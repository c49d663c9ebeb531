//! QMP on the daemon's monitor socket: QEMU's wire format and error replies, disks added and
//! removed at run time while others are served, iothreads' polling set, events; bad clients
//! (bad JSON, huge messages, unknown commands, wrong types, leaving mid-command, many at once)
//! answered or dropped while the daemon and its disks go on; and the replies compared with
//! qemu-storage-daemon's for the same command line, field by field.
//!
//! Needs `qemu-storage-daemon` for the comparison (Debian's `qemu-utils`; `.ci/run` installs
//! it).

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use aio_test_support::launch::Daemon as Launched;
use common::connect;
use qmp_client::{disk_works, start, Qmp};
use serde_json::{json, Value};

/// A directory in /dev/shm with a raw image of 64 MiB.
fn image() -> (tempfile::TempDir, PathBuf) {
    common::image(64 << 20)
}

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// A daemon with a monitor, and a negotiated client of it.
fn daemon_and_client() -> (tempfile::TempDir, Launched, PathBuf, PathBuf, Qmp) {
    let (dir, raw) = image();
    let (daemon, disk, monitor) = start(OURS, dir.path(), &raw);
    let (q, _) = Qmp::connect(&monitor, false);
    (dir, daemon, disk, monitor, q)
}

/// After a bad client: the monitor still answers a new client, the disk is still served, and
/// the daemon stops cleanly, removing the monitor's socket.
fn all_goes_on(daemon: Launched, disk: &Path, monitor: &Path) {
    let (mut fresh, _) = Qmp::connect(monitor, false);
    assert!(fresh.ok("query-version", json!({}))["qemu"].is_object());
    disk_works(disk);
    assert!(daemon.stop().unwrap().success());
    assert!(!monitor.exists(), "the monitor socket at exit");
}

#[test]
fn the_greeting_negotiation_and_ids_are_qemus() {
    let (dir, raw) = image();
    let (daemon, disk, monitor) = start(OURS, dir.path(), &raw);
    let (mut q, greeting) = Qmp::connect(&monitor, true);
    assert!(
        greeting["QMP"]["version"]["qemu"]["major"].is_u64(),
        "{greeting}"
    );
    assert!(greeting["QMP"]["capabilities"].is_array(), "{greeting}");
    // Before negotiation only qmp_capabilities; ids are echoed, whatever they are.
    let r = q.send(b"{\"execute\": \"query-version\", \"id\": {\"n\": [1]}}\n");
    assert_eq!(r["error"]["class"], "CommandNotFound", "{r}");
    assert_eq!(r["id"], json!({"n": [1]}));
    let r =
        q.send(b"{\"execute\": \"qmp_capabilities\", \"arguments\": {\"enable\": [\"oob\"]}}\n");
    assert_eq!(r["error"]["class"], "GenericError", "{r}");
    assert_eq!(q.call("qmp_capabilities", json!({})), json!({"return": {}}));
    let (class, _) = q.error("qmp_capabilities", json!({}));
    assert_eq!(class, "CommandNotFound");
    // Two messages in one write, and one split over two writes.
    q.writer
        .write_all(b"{\"execute\": \"query-version\", \"id\": 1}{\"execute\": \"query-ver")
        .unwrap();
    assert_eq!(q.reply()["id"], 1);
    let r = q.send(b"sion\", \"id\": 2}\n");
    assert_eq!(r["id"], 2);
    assert_eq!(
        r["return"]["package"]
            .as_str()
            .map(|p| p.starts_with("aio")),
        Some(true)
    );
    assert_eq!(q.repeated_greetings, 0, "one greeting per connection");
    all_goes_on(daemon, &disk, &monitor);
}

#[test]
fn malformed_messages_get_qemus_errors_and_the_connection_stays() {
    let (_dir, daemon, disk, monitor, mut q) = daemon_and_client();
    let cases: &[(&[u8], &str)] = &[
        (b"{\"execute\": }\n", "JSON parse error"),
        (b"[1, 2]\n", "must be a JSON object"),
        (b"{\"arguments\": {}}\n", "lacks member 'execute'"),
        (b"{\"execute\": 7}\n", "'execute' must be a string"),
        (
            b"{\"execute\": \"query-version\", \"arguments\": 1}\n",
            "must be an object",
        ),
        (
            b"{\"execute\": \"query-version\", \"x\": 1}\n",
            "'x' is unexpected",
        ),
    ];
    for (bytes, said) in cases {
        let r = q.send(bytes);
        let desc = r["error"]["desc"].as_str().unwrap_or_default();
        assert!(
            desc.contains(said),
            "{}: {r}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert!(q.ok("query-version", json!({}))["qemu"].is_object());
    all_goes_on(daemon, &disk, &monitor);
}

#[test]
fn unknown_commands_and_wrong_arguments_get_qemus_errors() {
    let (_dir, daemon, disk, monitor, mut q) = daemon_and_client();
    let (class, desc) = q.error("no-such-command", json!({}));
    assert_eq!(
        (class.as_str(), desc.contains("no-such-command")),
        ("CommandNotFound", true)
    );
    let (_, desc) = q.error("block-export-del", json!({"id": 5}));
    assert!(desc.contains("Invalid parameter type for 'id'"), "{desc}");
    let (_, desc) = q.error("block-export-del", json!({}));
    assert!(desc.contains("'id' is missing"), "{desc}");
    let (_, desc) = q.error("query-version", json!({"verbose": true}));
    assert!(desc.contains("'verbose' is unexpected"), "{desc}");
    let (_, desc) = q.error(
        "qom-set",
        json!({"path": "/objects/io0", "property": "poll-max-ns", "value": "x"}),
    );
    assert!(desc.contains("expects"), "{desc}");
    all_goes_on(daemon, &disk, &monitor);
}

#[test]
fn many_clients_at_once_some_leaving_mid_message_change_nothing() {
    let (_dir, daemon, disk, monitor, mut q) = daemon_and_client();
    let mut many: Vec<Qmp> = (0..40).map(|_| Qmp::connect(&monitor, false).0).collect();
    for (i, c) in many.iter_mut().enumerate() {
        if i % 4 == 0 {
            c.writer
                .write_all(format!("{{\"execute\": \"query-ver{i}").as_bytes())
                .unwrap();
        } else {
            assert!(c.ok("query-block-exports", json!({})).is_array());
        }
    }
    drop(many);
    assert!(q.ok("query-block-exports", json!({})).is_array());
    all_goes_on(daemon, &disk, &monitor);
}

#[test]
fn a_message_past_1_mib_ends_only_its_own_connection() {
    let (_dir, daemon, disk, monitor, mut q) = daemon_and_client();
    let (mut huge, _) = Qmp::connect(&monitor, false);
    let big = format!(
        "{{\"execute\": \"query-version\", \"x\": \"{}",
        "a".repeat(2 << 20)
    );
    let _ = huge.writer.write_all(big.as_bytes());
    let last = huge.line();
    assert!(
        last.as_ref().is_some_and(|v| v["error"]["desc"]
            .as_str()
            .is_some_and(|d| d.contains("exceeds"))),
        "the huge message's reply: {last:?}"
    );
    assert!(huge.line().is_none(), "the connection is closed after it");
    assert!(q.ok("query-block-exports", json!({})).is_array());
    all_goes_on(daemon, &disk, &monitor);
}

#[test]
fn exports_come_and_go_at_run_time_beside_the_others_and_iothreads_take_their_polling() {
    let (dir, raw) = image();
    let (daemon, disk, monitor) = start(OURS, dir.path(), &raw);
    let (mut q, _) = Qmp::connect(&monitor, false);
    let (mut watcher, _) = Qmp::connect(&monitor, false);
    // A second disk added at run time, served while the first is.
    let second = dir.path().join("second.raw");
    std::fs::File::create(&second)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let socket2 = dir.path().join("second.sock");
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "file1", "filename": second, "aio": "threads"}),
    );
    let (_, desc) = q.error(
        "blockdev-add",
        json!({"driver": "file", "node-name": "file1", "filename": "/x"}),
    );
    assert!(desc.contains("twice"), "{desc}");
    let (_, desc) = q.error("blockdev-add", json!({"driver": "vmdk", "node-name": "v"}));
    assert!(desc.contains("'vmdk'"), "{desc}");
    let add = json!({"type": "vhost-user-blk", "id": "exp1", "node-name": "file1",
        "addr": {"type": "unix", "path": socket2}, "writable": true, "iothread": "io0"});
    q.ok("block-export-add", add.clone());
    let (_, desc) = q.error("block-export-add", add);
    assert!(desc.contains("already in use"), "{desc}");
    let (_, desc) = q.error(
        "block-export-add",
        json!({"type": "vhost-user-blk", "id": "exp9", "node-name": "file1",
            "addr": {"type": "unix", "path": "/x"}, "iothread": "nope"}),
    );
    assert!(desc.contains("'nope'"), "{desc}");
    let exports = q.ok("query-block-exports", json!({}));
    let ids: Vec<&str> = exports
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["exp0", "exp1"]);
    let mut c = connect(&socket2, 1, 4096).unwrap();
    assert_eq!(c.capacity().unwrap(), 32 << 20);
    disk_works(&disk);
    // In use: refused, and the node with it; mode=hard disconnects the client.
    let (_, desc) = q.error("block-export-del", json!({"id": "exp1"}));
    assert!(desc.contains("still in use"), "{desc}");
    let (_, desc) = q.error("blockdev-del", json!({"node-name": "file1"}));
    assert_eq!(desc, "Node file1 is in use");
    q.ok("block-export-del", json!({"id": "exp1", "mode": "hard"}));
    c.write(0, 0, 0, 4096, 1);
    let done = c.wait_for(0, 1, Duration::from_secs(2)).unwrap_or_default();
    assert!(
        done.iter().all(|&(_, r)| r != 0),
        "a request after the hard delete completed: {done:?}"
    );
    drop(c);
    assert!(!socket2.exists(), "the deleted export's socket");
    q.ok("blockdev-del", json!({"node-name": "file1"}));
    let (_, desc) = q.error("block-export-del", json!({"id": "exp1"}));
    assert!(desc.contains("not found"), "{desc}");
    // The event, to every client past negotiation.
    let _ = watcher.ok("query-version", json!({}));
    let event = watcher.events.first().cloned().unwrap_or_default();
    assert_eq!(
        event["event"], "BLOCK_EXPORT_DELETED",
        "{:?}",
        watcher.events
    );
    assert_eq!(event["data"]["id"], "exp1");
    assert!(event["timestamp"]["seconds"].is_u64());
    // Iothreads: listed, polling read and set.
    let threads = q.ok("query-iothreads", json!({}));
    assert_eq!(threads[0]["id"], "io0");
    assert_eq!(threads[0]["poll-max-ns"], 16384);
    assert!(threads[0]["thread-id"].as_i64().unwrap() > 0);
    let path = json!({"path": "/objects/io0", "property": "poll-max-ns"});
    assert_eq!(q.ok("qom-get", path.clone()), 16384);
    q.ok(
        "qom-set",
        json!({"path": "/objects/io0", "property": "poll-max-ns", "value": 0}),
    );
    assert_eq!(q.ok("qom-get", path), 0);
    let (class, _) = q.error(
        "qom-get",
        json!({"path": "/objects/nope", "property": "poll-max-ns"}),
    );
    assert_eq!(class, "DeviceNotFound");
    disk_works(&disk);
    assert!(daemon.stop().unwrap().success());
}

#[test]
fn query_blockstats_counts_what_the_client_did() {
    let (_dir, daemon, disk, _monitor, mut q) = daemon_and_client();
    let before = q.ok("query-blockstats", json!({}));
    assert_eq!(before[0]["node-name"], "file0", "{before}");
    assert_eq!(before[0]["stats"]["rd_operations"], 0);
    assert!(
        before[0]["stats"].get("idle_time_ns").is_none(),
        "no I/O yet: {before}"
    );
    let (writes, reads) = (7u64, 5u64);
    let mut c = connect(&disk, 1, 8192).unwrap();
    c.fill_buf(0, 8192, 0x11);
    for i in 0..writes {
        c.write(0, i * 8192, 0, 8192, 1);
        assert_eq!(c.wait(0, 1), [(1, 0)]);
    }
    for i in 0..reads {
        c.read(0, i * 4096, 0, 4096, 2);
        assert_eq!(c.wait(0, 1), [(2, 0)]);
    }
    assert_eq!(c.sync(0, |q| q.flush(3, blkio::ReqFlags::empty())), 0);
    drop(c);
    let after = q.ok("query-blockstats", json!({}));
    let s = &after[0]["stats"];
    assert_eq!(s["wr_operations"], writes, "{after}");
    assert_eq!(s["wr_bytes"], writes * 8192);
    assert_eq!(s["rd_operations"], reads);
    assert_eq!(s["rd_bytes"], reads * 4096);
    assert!(s["flush_operations"].as_u64().unwrap() >= 1, "{after}");
    assert_eq!(s["wr_highest_offset"], writes * 8192);
    assert_eq!(s["failed_wr_operations"], 0);
    assert!(s["rd_total_time_ns"].as_u64().unwrap() > 0);
    assert!(s["idle_time_ns"].is_u64(), "{after}");
    let by_node = q.ok("query-blockstats", json!({"query-nodes": true}));
    assert_eq!(by_node[0]["stats"]["wr_operations"], writes, "{by_node}");
    let (_, desc) = q.error("query-blockstats", json!({"query-nodes": "yes"}));
    assert!(desc.contains("expected: bool"), "{desc}");
    assert!(daemon.stop().unwrap().success());
}

#[test]
fn latency_histograms_count_from_when_they_are_set() {
    let (_dir, daemon, disk, _monitor, mut q) = daemon_and_client();
    let set = |q: &mut Qmp, args: Value| q.ok("block-latency-histogram-set", args);
    // Everything under 1000 s falls in bin 0.
    set(
        &mut q,
        json!({"id": "exp0", "boundaries": [1_000_000_000_000u64]}),
    );
    let mut c = connect(&disk, 1, 4096).unwrap();
    let mut io = |reads: u64, writes: u64| {
        for i in 0..reads {
            c.read(0, i * 4096, 0, 4096, 1);
            assert_eq!(c.wait(0, 1), [(1, 0)]);
        }
        for i in 0..writes {
            c.write(0, i * 4096, 0, 4096, 2);
            assert_eq!(c.wait(0, 1), [(2, 0)]);
        }
    };
    io(5, 3);
    let stats = |q: &mut Qmp| q.ok("query-blockstats", json!({}))[0]["stats"].clone();
    let s = stats(&mut q);
    let bins = |s: &Value, field: &str| s[field]["bins"].clone();
    assert_eq!(bins(&s, "rd_latency_histogram"), json!([5, 0]), "{s}");
    assert_eq!(bins(&s, "wr_latency_histogram"), json!([3, 0]));
    assert_eq!(bins(&s, "flush_latency_histogram"), json!([0, 0]));
    assert_eq!(
        s["rd_latency_histogram"]["boundaries"],
        json!([1_000_000_000_000u64])
    );
    // One kind reset by its node's name; the others keep counting. A request's time from
    // taken to done (a file, served on a pool thread) is at least 1 ns.
    set(
        &mut q,
        json!({"id": "file0", "boundaries-read": [1, 1_000_000_000_000u64]}),
    );
    io(2, 1);
    let s = stats(&mut q);
    assert_eq!(bins(&s, "rd_latency_histogram"), json!([0, 2, 0]), "{s}");
    assert_eq!(bins(&s, "wr_latency_histogram"), json!([4, 0]));
    // Refused, nothing changed; then none given removes them all.
    let e = q.error(
        "block-latency-histogram-set",
        json!({"id": "exp0", "boundaries": [5, 5]}),
    );
    assert_eq!(e.1, "Device 'exp0' set read boundaries fail");
    let e = q.error("block-latency-histogram-set", json!({"id": "nope"}));
    assert_eq!(
        e,
        (
            "DeviceNotFound".to_string(),
            "Device 'nope' not found".to_string()
        )
    );
    assert_eq!(bins(&stats(&mut q), "wr_latency_histogram"), json!([4, 0]));
    set(&mut q, json!({"id": "exp0"}));
    let s = stats(&mut q);
    assert!(s.get("rd_latency_histogram").is_none(), "{s}");
    assert!(s.get("wr_latency_histogram").is_none(), "{s}");
    drop(c);
    assert!(daemon.stop().unwrap().success());
}

#[test]
fn quit_stops_the_daemon_as_sigterm_does_after_its_reply_and_event() {
    let (_dir, daemon, disk, monitor, mut q) = daemon_and_client();
    let (mut watcher, _) = Qmp::connect(&monitor, false);
    assert_eq!(q.ok("quit", json!({})), json!({}));
    // qemu-storage-daemon sends no SHUTDOWN (the system emulator's event): the connection
    // ends, after the export's end is announced.
    let mut seen = Vec::new();
    while let Some(message) = watcher.line() {
        seen.push(message);
    }
    assert!(seen.iter().all(|m| m["event"] != "SHUTDOWN"), "{seen:?}");
    let status = daemon.wait_exit(Duration::from_secs(10)).expect("it exits");
    assert!(status.success(), "{status}");
    assert!(
        !disk.exists() && !monitor.exists(),
        "sockets removed as at SIGTERM"
    );
}

/// The fields of a reply both daemons give, for comparison.
fn common_fields(ours: &Value, theirs: &Value, fields: &[&str]) -> (Vec<Value>, Vec<Value>) {
    let pick = |list: &Value| -> Vec<Value> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|item| {
                let picked: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|f| {
                        (
                            f.to_string(),
                            item.pointer(f).cloned().unwrap_or(Value::Null),
                        )
                    })
                    .collect();
                Value::Object(picked)
            })
            .collect()
    };
    (pick(ours), pick(theirs))
}

#[test]
fn the_replies_match_qemu_storage_daemons_field_by_field() {
    if !common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let mut replies = Vec::new();
    for program in [OURS, "qemu-storage-daemon"] {
        let (dir, raw) = image();
        let (daemon, _, monitor) = start(program, dir.path(), &raw);
        let (mut q, greeting) = Qmp::connect(&monitor, false);
        assert!(
            greeting["QMP"]["version"]["qemu"].is_object(),
            "{program}: {greeting}"
        );
        let nodes = q.ok("query-named-block-nodes", json!({"flat": true}));
        let exports = q.ok("query-block-exports", json!({}));
        // qemu-storage-daemon has no query-iothreads: the polling through qom-get.
        let threads = Value::Array(
            ["poll-max-ns", "poll-grow", "poll-shrink"]
                .iter()
                .map(|p| q.ok("qom-get", json!({"path": "/objects/io0", "property": p})))
                .collect(),
        );
        let unknown = q.error("no-such-command", json!({}));
        let missing = q.error("block-export-del", json!({})).0;
        let absent = q.error("block-export-del", json!({"id": "nope"})).0;
        replies.push((nodes, exports, threads, unknown.0, missing, absent, raw));
        assert!(daemon.stop().unwrap().success(), "{program}");
    }
    let (ours, theirs) = (&replies[0], &replies[1]);
    // Each run had its own image path: compare them as "the image".
    let path = |v: &Value, raw: &Path| {
        let text = v.to_string().replace(&raw.display().to_string(), "IMAGE");
        serde_json::from_str::<Value>(&text).unwrap()
    };
    let node_fields = [
        "/node-name",
        "/drv",
        "/ro",
        "/file",
        "/encrypted",
        "/image/virtual-size",
        "/image/dirty-flag",
        "/active",
        "/bps",
        "/iops_wr",
        "/write_threshold",
        "/backing_file_depth",
        "/detect_zeroes",
    ];
    let (a, b) = common_fields(
        &path(&ours.0, &ours.6),
        &path(&theirs.0, &theirs.6),
        &node_fields,
    );
    assert_eq!(a, b, "query-named-block-nodes");
    let export_fields = ["/type", "/id", "/node-name", "/shutting-down"];
    let (a, b) = common_fields(&ours.1, &theirs.1, &export_fields);
    assert_eq!(a, b, "query-block-exports");
    assert_eq!(ours.2, theirs.2, "qom-get of the iothread's polling");
    assert_eq!(ours.2, json!([16384, 0, 0]));
    assert_eq!(
        (&ours.3, &ours.4, &ours.5),
        (&theirs.3, &theirs.4, &theirs.5),
        "error classes"
    );
}

/// The Python environment with QEMU's QMP library (`scripts/qmp-venv.sh`, made once under
/// `target/`), or None (said by `skip`) where Python or PyPI cannot be had.
fn qmp_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("../target/qmp-venv");
    let out = Command::new("bash")
        .arg(root.join("scripts/qmp-venv.sh"))
        .arg(&venv)
        .output()
        .expect("run scripts/qmp-venv.sh");
    match out.status.code() {
        Some(0) => Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())),
        Some(2) => {
            aio_conformance::skip(&String::from_utf8_lossy(&out.stderr));
            None
        }
        _ => panic!("qmp-venv.sh: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn qemus_own_qmp_client_adds_serves_counts_resizes_and_deletes_an_export() {
    let Some(python) = qmp_python() else { return };
    let (dir, raw) = image();
    let (daemon, disk, monitor) = start(OURS, dir.path(), &raw);
    let socket = dir.path().join("new.sock");
    let new_image = dir.path().join("new.img");
    std::fs::File::create(&new_image)
        .and_then(|f| f.set_len(16 << 20))
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/qmp/session.py");
    let mut session = Command::new(python)
        .arg(script)
        .arg(&monitor)
        .arg(&socket)
        .arg(&new_image)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the QMP session");
    let mut said = BufReader::new(session.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "EXPORT-ADDED", "the session ended early");
    // The export added by QEMU's client serves a libblkio client, beside the first disk.
    let mut c = connect(&socket, 1, 4096).unwrap();
    assert_eq!(c.capacity().unwrap(), 16 << 20);
    c.fill_buf(0, 4096, 0xff);
    c.read(0, 0, 0, 4096, 1);
    assert_eq!(c.wait(0, 1), [(1, 0)]);
    assert!(c.read_buf(0, 4096).iter().all(|&b| b == 0));
    c.write(0, 8192, 0, 4096, 2);
    assert_eq!(c.wait(0, 1), [(2, 0)]);
    drop(c);
    disk_works(&disk);
    // The session checks query-blockstats against these counts, then resizes.
    writeln!(session.stdin.take().unwrap(), "CLIENT-DONE 1 1").unwrap();
    line.clear();
    said.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "SESSION-OK");
    assert!(session.wait().unwrap().success());
    assert!(!socket.exists(), "the deleted export's socket");
    assert_eq!(
        std::fs::metadata(&new_image).unwrap().len(),
        32 << 20,
        "resized"
    );
    disk_works(&disk);
    assert!(daemon.stop().unwrap().success());
}

/// qemu-storage-daemon's command line and QMP build the same graph (both are calls of the
/// daemon's block graph): one daemon is given file, raw and null-co nodes, an iothread, the
/// NBD server and a vhost-user-blk and an NBD export on its command line; another, with only a
/// monitor, gets the same through `object-add`, `blockdev-add`, `nbd-server-start` and
/// `block-export-add`. Their `query-named-block-nodes`, `query-block-exports` and
/// `query-iothreads` answers are equal, and both serve the disk.
#[test]
fn the_command_line_and_qmp_build_the_same_graph() {
    let (dir, raw) = image();
    let second = dir.path().join("second.img");
    std::fs::File::create(&second)
        .and_then(|f| f.set_len(8 << 20))
        .unwrap();
    let (disk, monitor, nbd) = (
        dir.path().join("disk.sock"),
        dir.path().join("qmp.sock"),
        dir.path().join("nbd.sock"),
    );
    let monitor_args = [
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ];
    let file0 = format!(
        "driver=file,node-name=file0,filename={},aio=threads",
        raw.display()
    );
    let file1 = format!("driver=file,node-name=file1,filename={}", second.display());
    let vhost = format!(
        "type=vhost-user-blk,id=exp0,node-name=raw1,addr.type=unix,addr.path={},writable=on,\
         iothread=io0,num-queues=2",
        disk.display()
    );
    let launch = |args: Vec<String>, sockets: &[&Path]| {
        let mut l = aio_test_support::launch::Launch::new(OURS)
            .args(args)
            .label("the daemon")
            .socket_wait(Duration::from_secs(20));
        for s in sockets {
            l = l.socket(s.to_path_buf());
        }
        l.start().unwrap_or_else(|e| panic!("{e}"))
    };
    let answers = |monitor: &Path| {
        let (mut q, _) = Qmp::connect(monitor, false);
        let mut iothreads = q.ok("query-iothreads", json!({}));
        for t in iothreads.as_array_mut().unwrap() {
            t.as_object_mut().unwrap().remove("thread-id");
        }
        // A node's `actual-size` is its file's allocation now (the first daemon's writes
        // change it), not part of the graph.
        let mut nodes = q.ok("query-named-block-nodes", json!({"flat": true}));
        for n in nodes.as_array_mut().unwrap() {
            n["image"].as_object_mut().unwrap().remove("actual-size");
        }
        (nodes, q.ok("query-block-exports", json!({})), iothreads)
    };

    let mut line: Vec<String> = [
        "--object",
        "iothread,id=io0,poll-max-ns=16384",
        "--blockdev",
        &file0,
        "--blockdev",
        &file1,
        "--blockdev",
        "driver=raw,node-name=raw1,file=file1",
        "--blockdev",
        "driver=null-co,node-name=null0,size=4M",
        "--nbd-server",
        &format!("addr.type=unix,addr.path={}", nbd.display()),
        "--export",
        &vhost,
        "--export",
        "type=nbd,id=exp1,node-name=null0,name=zeros",
    ]
    .map(String::from)
    .to_vec();
    line.extend(monitor_args.iter().cloned());
    let from_line = launch(line, &[&disk, &monitor, &nbd]);
    let by_line = answers(&monitor);
    disk_works(&disk);
    assert!(from_line.stop().unwrap().success());

    let from_qmp = launch(monitor_args.to_vec(), &[&monitor]);
    let (mut q, _) = Qmp::connect(&monitor, false);
    let opts = |text: &str| -> Value {
        let mut map = serde_json::Map::new();
        for pair in text.split(',') {
            let (k, v) = pair.split_once('=').unwrap();
            let value = match v.parse::<u64>() {
                Ok(n) => json!(n),
                Err(_) if v == "on" => json!(true),
                Err(_) => json!(v),
            };
            match k.split_once('.') {
                Some((outer, inner)) => {
                    let entry = map.entry(outer).or_insert_with(|| json!({}));
                    entry[inner] = value;
                }
                None => {
                    map.insert(k.to_string(), value);
                }
            }
        }
        Value::Object(map)
    };
    q.ok(
        "object-add",
        opts("qom-type=iothread,id=io0,poll-max-ns=16384"),
    );
    for node in [
        file0.as_str(),
        &file1,
        "driver=raw,node-name=raw1,file=file1",
        "driver=null-co,node-name=null0,size=4194304",
    ] {
        q.ok("blockdev-add", opts(node));
    }
    q.ok(
        "nbd-server-start",
        opts(&format!("addr.type=unix,addr.path={}", nbd.display())),
    );
    q.ok("block-export-add", opts(&vhost));
    q.ok(
        "block-export-add",
        opts("type=nbd,id=exp1,node-name=null0,name=zeros"),
    );
    drop(q);
    let by_qmp = answers(&monitor);
    disk_works(&disk);
    assert!(from_qmp.stop().unwrap().success());

    assert_eq!(by_line.0, by_qmp.0, "query-named-block-nodes");
    assert_eq!(by_line.1, by_qmp.1, "query-block-exports");
    assert_eq!(by_line.2, by_qmp.2, "query-iothreads");
    let names: Vec<_> = by_line
        .0
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node-name"].clone())
        .collect();
    assert_eq!(names, ["file0", "file1", "null0", "raw1"]);
    let ids: Vec<_> = by_line
        .1
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].clone())
        .collect();
    assert_eq!(ids, ["exp0", "exp1"]);
}
