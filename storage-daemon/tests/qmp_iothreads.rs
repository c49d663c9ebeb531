//! Iothreads added and removed over QMP while the daemon runs (`object-add` / `object-del`):
//! a new iothread serves an export added on it, is refused removal while that export lives,
//! and its thread is gone once removed; errors are QEMU's; and the same commands given to
//! qemu-storage-daemon get the same replies.
//!
//! Needs `qemu-storage-daemon` for the comparison (Debian's `qemu-utils`; `.ci/run` installs
//! it).

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;

use qmp_client::{disk_works, start, Qmp};
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// The names of `pid`'s threads (an engine's pool adds workers as requests come: counted
/// only before and after requests on the same iothreads).
fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn an_iothread_added_at_run_time_serves_an_export_and_goes_when_removed() {
    let (dir, raw) = common::image(16 << 20);
    let (daemon, _, monitor) = start(OURS, dir.path(), &raw);
    let (mut q, _) = Qmp::connect(&monitor, false);
    let before = thread_names(daemon.pid()).len();
    q.ok(
        "object-add",
        json!({"qom-type": "iothread", "id": "io9", "poll-max-ns": 1000, "poll-grow": 2}),
    );
    let threads = q.ok("query-iothreads", json!({}));
    let io9 = threads
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "io9")
        .unwrap_or_else(|| panic!("io9 listed: {threads}"))
        .clone();
    assert_eq!(
        (io9["poll-max-ns"].clone(), io9["poll-grow"].clone()),
        (json!(1000), json!(2))
    );
    let tid = io9["thread-id"].as_i64().unwrap();
    assert!(
        Path::new(&format!("/proc/{}/task/{tid}", daemon.pid())).exists(),
        "thread-id {tid} is one of the daemon's threads"
    );
    assert_eq!(thread_names(daemon.pid()).len(), before + 1);

    // An export on it serves a client; the iothread cannot go while the export lives.
    let (img, socket) = (dir.path().join("b.img"), dir.path().join("b.sock"));
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(1 << 20))
        .unwrap();
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "file1", "filename": img,
               "cache": {"direct": true}}),
    );
    q.ok(
        "block-export-add",
        json!({"type": "vhost-user-blk", "id": "exp1", "node-name": "file1", "writable": true,
               "iothread": "io9", "addr": {"type": "unix", "path": socket}}),
    );
    disk_works(&socket);
    let (_, desc) = q.error("object-del", json!({"id": "io9"}));
    assert!(desc.contains("in use"), "{desc}");
    q.ok_once_clients_gone("block-export-del", json!({"id": "exp1"}));
    q.ok("object-del", json!({"id": "io9"}));
    assert!(
        !Path::new(&format!("/proc/{}/task/{tid}", daemon.pid())).exists(),
        "its thread is gone"
    );
    assert_eq!(
        thread_names(daemon.pid()).len(),
        before,
        "{:?}",
        thread_names(daemon.pid())
    );
    let threads = q.ok("query-iothreads", json!({}));
    assert!(!threads.to_string().contains("io9"), "{threads}");
    // The command line's iothread and its export go on; a new object takes a new thread.
    disk_works(&dir.path().join("disk.sock"));
    q.ok("object-add", json!({"qom-type": "iothread", "id": "io9"}));
    let threads = q.ok("query-iothreads", json!({}));
    let tid = threads
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "io9")
        .unwrap()["thread-id"]
        .as_i64()
        .unwrap();
    assert!(Path::new(&format!("/proc/{}/task/{tid}", daemon.pid())).exists());
    assert!(daemon.stop().unwrap().success());
}

#[test]
fn object_commands_answer_as_qemu_storage_daemon_does() {
    if !common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let mut replies: Vec<Vec<Value>> = Vec::new();
    for program in [OURS, "qemu-storage-daemon"] {
        let (dir, raw) = common::image(16 << 20);
        let (daemon, _, monitor) = start(program, dir.path(), &raw);
        let (mut q, _) = Qmp::connect(&monitor, false);
        let mut said = Vec::new();
        for (command, args) in [
            (
                "object-add",
                json!({"qom-type": "iothread", "id": "io9", "poll-max-ns": 1000}),
            ),
            (
                "qom-get",
                json!({"path": "/objects/io9", "property": "poll-max-ns"}),
            ),
            (
                "qom-set",
                json!({"path": "/objects/io9", "property": "poll-grow", "value": 4}),
            ),
            (
                "qom-get",
                json!({"path": "/objects/io9", "property": "poll-grow"}),
            ),
            ("object-add", json!({"qom-type": "iothread", "id": "io9"})),
            ("object-add", json!({"qom-type": "iothread", "id": "io0"})),
            (
                "object-add",
                json!({"qom-type": "memory-backend-ram", "id": "m0", "size": 4096}),
            ),
            ("object-add", json!({"id": "x"})),
            ("object-del", json!({"id": "io9"})),
            (
                "qom-get",
                json!({"path": "/objects/io9", "property": "poll-max-ns"}),
            ),
            ("object-del", json!({"id": "io9"})),
            ("object-del", json!({})),
        ] {
            let mut reply = q.call(command, args);
            if let Some(e) = reply.get_mut("error") {
                // Compared: the class, and the text.
                *e = json!({"class": e["class"], "desc": e["desc"]});
            }
            said.push(json!({"command": command, "reply": reply}));
        }
        replies.push(said);
        assert!(daemon.stop().unwrap().success(), "{program}");
    }
    for (ours, theirs) in replies[0].iter().zip(&replies[1]) {
        assert_eq!(ours, theirs, "ours, then qemu-storage-daemon's");
    }
}
