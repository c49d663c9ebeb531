//! The daemon's NBD export, from outside: our command line and qemu-storage-daemon's, QMP's
//! NBD commands, one image served through vhost-user-blk and NBD at once within its locks,
//! and the answers compared with qemu-storage-daemon's NBD export for the same command line.
//!
//! Needs `qemu-img`, `qemu-io`, `qemu-storage-daemon` (`qemu-utils`) and `nbdinfo`
//! (`libnbd-bin`); `.ci/run` installs them.

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aio_nbd::proto::{cmd, cmd_flag, err, tflag};
use aio_nbd::testing::Raw;
use aio_test_support::images::{image_dir, qcow2_image, raw_image};
use aio_test_support::launch::{Daemon as Launched, Launch};
use common::{connect, qemu_img, Daemon};
use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `qemu-io` with `commands` on `uri` (raw over NBD, read-only when every command reads); its
/// output, which must not say "failed".
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    if commands.iter().all(|c| c.starts_with("read")) {
        args.push("-r");
    }
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let out = Command::new("qemu-io")
        .args(&args)
        .output()
        .expect("qemu-io (install qemu-utils)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.contains("failed"),
        "qemu-io {commands:?}: {text}"
    );
    text
}

fn unix_uri(socket: &Path, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", socket.display())
}

#[test]
fn one_image_is_served_over_vhost_user_and_nbd_at_once_within_its_locks() {
    let (dir, img) = common::image(64 << 20);
    let vhost = dir.path().join("vhost.sock");
    let nbd = dir.path().join("nbd.sock");
    let args: Vec<String> = [
        "--disk".to_string(),
        format!("socket={},image={}", s(&vhost), s(&img)),
        "--nbd".to_string(),
        format!("unix:{}", s(&nbd)),
        "--nbd-export".to_string(),
        format!("name=backup,image={},description=the VM's disk", s(&img)),
        "--nbd-export".to_string(),
        format!("name=rw,image={},writable=on", s(&img)),
    ]
    .into();
    let daemon = Daemon::start(&args, vec![vhost.clone(), nbd.clone()]);
    // The VM writes; the backup reads what it wrote.
    let mut vm = connect(&vhost, 1, 1 << 20).unwrap();
    vm.fill_buf(0, 65536, 0x3c);
    vm.write(0, 1 << 20, 0, 65536, 1);
    assert_eq!(vm.wait(0, 1), [(1, 0)]);
    qemu_io(&unix_uri(&nbd, "backup"), &["read -P 0x3c 1M 64k"]);
    // A writable NBD export of the same image: what it writes, the VM reads.
    qemu_io(&unix_uri(&nbd, "rw"), &["write -P 0x5d 4M 64k", "flush"]);
    vm.read(0, 4 << 20, 0, 65536, 2);
    assert_eq!(vm.wait(0, 1), [(2, 0)]);
    assert!(vm.read_buf(0, 65536).iter().all(|&b| b == 0x5d));
    let info = Command::new("nbdinfo")
        .args(["--json", &unix_uri(&nbd, "backup")])
        .output()
        .expect("nbdinfo (install libnbd-bin)");
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], json!(64 << 20));
    assert_eq!(export["is_read_only"], json!(true));
    assert_eq!(export["description"], json!("the VM's disk"));
    // The image's locks hold for both: QEMU's tools are refused a write.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write 0 512", s(&img)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("lock"),
        "a second writer was not refused: {text}"
    );
    drop(vm);
    assert!(daemon.terminate().success());
    assert!(!nbd.exists(), "the NBD socket is left behind");
}

/// A `qemu-img map --output=json` as (start, length, data, zero), neighbours with the same
/// flags merged (a map over NBD and one of the file split runs differently).
fn map_of(json_lines: &str) -> Vec<(u64, u64, bool, bool)> {
    let list: Value = serde_json::from_str(json_lines).unwrap();
    let mut merged: Vec<(u64, u64, bool, bool)> = Vec::new();
    for e in list.as_array().unwrap() {
        let (start, length) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        let (data, zero) = (e["data"] == json!(true), e["zero"] == json!(true));
        match merged.last_mut() {
            Some(last) if (last.2, last.3) == (data, zero) => last.1 += length,
            _ => merged.push((start, length, data, zero)),
        }
    }
    merged
}

/// A new 64 MiB qcow2 image in a temporary directory where `O_DIRECT` works.
fn new_qcow2() -> (tempfile::TempDir, PathBuf) {
    let dir = image_dir("nbd");
    let qcow2 = qcow2_image(dir.path(), "disk.qcow2", "64M");
    (dir, qcow2)
}

/// Starts `program` with `args` in `dir` (its log there) and waits for `sockets`.
fn launch(program: &str, args: Vec<String>, dir: &Path, sockets: &[&Path]) -> Launched {
    let mut launch = Launch::new(program)
        .args(args)
        .label(program)
        .log_to(dir.join("log"))
        .socket_wait(Duration::from_secs(20));
    for socket in sockets {
        launch = launch.socket(socket.to_path_buf());
    }
    launch.start().unwrap_or_else(|e| panic!("{e}"))
}

/// A qemu-storage-daemon command line exporting a qcow2 image over NBD (and a monitor).
fn qsd_args(dir: &Path, qcow2: &Path) -> (Vec<String>, PathBuf, PathBuf) {
    let (nbd, monitor) = (dir.join("nbd.sock"), dir.join("qmp.sock"));
    let args = [
        "--blockdev",
        &format!(
            "driver=file,node-name=file0,filename={},cache.direct=on",
            s(qcow2)
        ),
        "--blockdev",
        "driver=qcow2,node-name=disk0,file=file0",
        "--nbd-server",
        &format!("addr.type=unix,addr.path={}", s(&nbd)),
        "--export",
        "type=nbd,id=exp0,node-name=disk0,name=disk,writable=on",
        "--chardev",
        &format!("socket,id=m0,path={},server=on,wait=off", s(&monitor)),
        "--monitor",
        "chardev=m0",
    ]
    .map(String::from)
    .to_vec();
    (args, nbd, monitor)
}

#[test]
fn a_qsd_command_line_serves_nbd_and_qmp_adds_removes_and_stops_exports() {
    let (dir, qcow2) = new_qcow2();
    let (args, nbd, monitor) = qsd_args(dir.path(), &qcow2);
    let daemon = launch(OURS, args, dir.path(), &[&nbd, &monitor]);
    let uri = unix_uri(&nbd, "disk");
    qemu_io(&uri, &["write -P 0x21 0 1M", "write -z 2M 1M", "flush"]);
    // Block status over NBD is the file's map, as qemu-img reads it beside the daemon.
    assert_eq!(
        map_of(&qemu_img(&["map", "--output=json", "-f", "raw", &uri])),
        map_of(&qemu_img(&[
            "map",
            "--output=json",
            "-U",
            "-f",
            "qcow2",
            s(&qcow2)
        ])),
    );
    let (mut q, _) = Qmp::connect(&monitor, false);
    let exports = q.ok("query-block-exports", json!({}));
    assert_eq!(
        exports,
        json!([{"type": "nbd", "id": "exp0", "node-name": "disk0", "shutting-down": false}])
    );
    // The reads and writes over NBD are the node's statistics.
    let stats = q.ok("query-blockstats", json!({}));
    assert_eq!(stats[0]["stats"]["wr_bytes"], json!(2 << 20), "{stats}");
    // A second, read-only export of the same node; and the same node over vhost-user.
    q.ok(
        "block-export-add",
        json!({"type": "nbd", "id": "exp1", "node-name": "disk0", "name": "ro"}),
    );
    qemu_io(&unix_uri(&nbd, "ro"), &["read -P 0x21 0 1M"]);
    let vhost = dir.path().join("vhost.sock");
    q.ok(
        "block-export-add",
        json!({"type": "vhost-user-blk", "id": "exp2", "node-name": "disk0",
               "addr": {"type": "unix", "path": s(&vhost)}, "writable": true}),
    );
    qmp_client::disk_works(&vhost);
    q.ok_once_clients_gone("block-export-del", json!({"id": "exp2"}));
    // Safe removal is refused while a client is connected; hard removal ends it.
    let mut client = Raw::fixed(&nbd);
    client.go("ro");
    let (_, desc) = q.error("block-export-del", json!({"id": "exp1"}));
    assert!(desc.contains("in use"), "{desc}");
    q.ok("block-export-del", json!({"id": "exp1", "mode": "hard"}));
    assert!(client.closed());
    // Stopping the server ends its exports, as QEMU's does; starting it again serves new ones.
    q.ok("nbd-server-stop", json!({}));
    // (Events follow their command's reply: the next call reads them.)
    assert_eq!(q.ok("query-block-exports", json!({})), json!([]));
    let deleted: Vec<&Value> = q
        .events
        .iter()
        .filter(|e| e["event"] == "BLOCK_EXPORT_DELETED")
        .collect();
    assert_eq!(deleted.len(), 3, "{:?}", q.events);
    let (_, desc) = q.error(
        "block-export-add",
        json!({"type": "nbd", "id": "e", "node-name": "disk0"}),
    );
    assert!(desc.contains("NBD server not running"), "{desc}");
    q.ok(
        "nbd-server-start",
        json!({"addr": {"type": "inet", "data": {"host": "127.0.0.1", "port": "0"}}}),
    );
    let (_, desc) = q.error(
        "nbd-server-start",
        json!({"addr": {"type": "unix", "data": {"path": "/x"}}}),
    );
    assert!(desc.contains("already running"), "{desc}");
    drop(daemon);
}

/// The answers of the daemon at `nbd` to the same bad requests, in order.
fn bad_request_answers(nbd: &Path) -> Vec<u32> {
    let mut c = Raw::fixed(nbd);
    let (size, flags) = c.go("disk");
    assert_eq!(size, 64 << 20);
    assert_eq!(flags & tflag::READ_ONLY, 0);
    let requests = [
        (0, cmd::READ, size, 512, false),
        (0, cmd::WRITE, size, 4096, true),
        (0, cmd::WRITE_ZEROES, size - 512, 4096, false),
        (0, cmd::READ, 0, 64 << 20, false),
        (0x4000, cmd::READ, 0, 4096, false),
        (0, 42, 0, 4096, false),
        (0, cmd::BLOCK_STATUS, 0, 4096, false),
        (cmd_flag::FUA, cmd::WRITE, 0, 4096, true),
    ];
    let mut answers = Vec::new();
    for (cookie, (flags, kind, offset, len, payload)) in (1..).zip(requests) {
        c.request(flags, kind, cookie, offset, len);
        if payload {
            c.send(&vec![0x42; len as usize]);
        }
        let (error, got) = c.simple_reply();
        assert_eq!(got, cookie);
        answers.push(error);
    }
    answers
}

#[test]
fn ours_and_qemu_storage_daemon_answer_the_same_requests_alike() {
    let mut seen = Vec::new();
    for program in ["qemu-storage-daemon", OURS] {
        // Each its own new image, written the same way.
        let (dir, qcow2) = new_qcow2();
        let (args, nbd, monitor) = qsd_args(dir.path(), &qcow2);
        let daemon = launch(program, args, dir.path(), &[&nbd, &monitor]);
        let uri = unix_uri(&nbd, "disk");
        let info = Command::new("nbdinfo")
            .args(["--json", &uri])
            .output()
            .expect("nbdinfo");
        let info: Value = serde_json::from_slice(&info.stdout).unwrap();
        let e = &info["exports"][0];
        let fields = [
            "export-size",
            "is_read_only",
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_fast_zero",
            "can_cache",
            "can_df",
            "can_multi_conn",
            "block_size_minimum",
            "block_size_preferred",
            "block_size_maximum",
        ];
        let described: Vec<(&str, Value)> = fields.iter().map(|f| (*f, e[*f].clone())).collect();
        let answers = bad_request_answers(&nbd);
        qemu_io(&uri, &["write -P 0x66 1M 64k", "write -z 8M 1M"]);
        let map = map_of(&qemu_img(&["map", "--output=json", "-f", "raw", &uri]));
        seen.push((program, described, answers, map));
        drop(daemon);
    }
    let (qsd, ours) = (&seen[0], &seen[1]);
    // One difference, by design: QEMU's qcow2 driver takes byte-granular requests (its block
    // layer reads, modifies and writes the sectors around them); ours takes whole sectors and
    // says so, as the protocol lets a server.
    let minimum = |d: &[(&str, Value)]| {
        d.iter()
            .find(|f| f.0 == "block_size_minimum")
            .map(|f| f.1.clone())
    };
    assert_eq!(minimum(&qsd.1), Some(json!(1)));
    assert_eq!(minimum(&ours.1), Some(json!(512)));
    let rest = |d: &[(&str, Value)]| -> Vec<(String, Value)> {
        d.iter()
            .filter(|f| f.0 != "block_size_minimum")
            .map(|f| (f.0.to_string(), f.1.clone()))
            .collect()
    };
    assert_eq!(rest(&qsd.1), rest(&ours.1), "what nbdinfo reports");
    // The protocol says a write or write-zeroes past the end SHOULD be ENOSPC, which ours
    // answers; qemu-storage-daemon 10.0.2 answers EINVAL there. Every other answer is equal.
    let past_end_writes = [1, 2];
    for (i, (q, o)) in qsd.2.iter().zip(&ours.2).enumerate() {
        if past_end_writes.contains(&i) {
            assert_eq!((*q, *o), (err::EINVAL, err::ENOSPC), "request {i}");
        } else {
            assert_eq!(q, o, "bad request {i}: {:?} against {:?}", qsd.2, ours.2);
        }
    }
    assert_eq!(qsd.3, ours.3, "block status after the same writes");
}

#[test]
fn tls_creds_in_qemus_layout_serve_qemu_over_tls_as_qemu_storage_daemon_does() {
    let pki = aio_nbd::testing::TestPki::new();
    for program in ["qemu-storage-daemon", OURS] {
        let dir = image_dir("nbd");
        let raw = raw_image(dir.path(), "disk.raw", 16 << 20, 0, 0);
        let nbd = dir.path().join("nbd.sock");
        let args = [
            "--object",
            &format!(
                "tls-creds-x509,id=tls0,endpoint=server,dir={},verify-peer=on",
                s(&pki.server)
            ),
            "--blockdev",
            &format!("driver=file,node-name=disk0,filename={}", s(&raw)),
            "--nbd-server",
            &format!("addr.type=unix,addr.path={},tls-creds=tls0", s(&nbd)),
            "--export",
            "type=nbd,id=exp0,node-name=disk0,name=disk,writable=on",
        ]
        .map(String::from);
        let daemon = launch(program, args.to_vec(), dir.path(), &[&nbd]);
        let qemu_io = |client: &Path| {
            let object = format!(
                "tls-creds-x509,id=c0,endpoint=client,dir={}",
                client.display()
            );
            let image = format!(
                "driver=nbd,server.type=unix,server.path={},export=disk,tls-creds=c0,\
                 tls-hostname=localhost",
                s(&nbd)
            );
            let out = Command::new("qemu-io")
                .args(["--object", &object, "--image-opts", &image])
                .args(["-c", "write -P 0x2b 0 64k", "-c", "read -P 0x2b 0 64k"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            out.status.success() && !text.contains("failed")
        };
        assert!(qemu_io(&pki.client), "{program}: the client the CA signed");
        assert!(!qemu_io(&pki.rogue), "{program}: another CA's client");
        // A client without TLS is refused the export.
        let plain = Command::new("qemu-img")
            .args(["info", &unix_uri(&nbd, "disk")])
            .output()
            .unwrap();
        assert!(!plain.status.success(), "{program}: a client without TLS");
        drop(daemon);
    }
}

#[test]
fn allocation_depth_of_a_qcow2_chain_is_qemu_storage_daemons() {
    let dir = image_dir("nbd");
    let (base, top) = (dir.path().join("base.qcow2"), dir.path().join("top.qcow2"));
    qemu_img(&["create", "-q", "-f", "qcow2", s(&base), "64M"]);
    let io = |image: &Path, c: &str| {
        let out = Command::new("qemu-io")
            .args(["-c", c, s(image)])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    io(&base, "write -P 0x11 0 4M");
    io(&base, "write -P 0x12 40M 2M");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        s(&base),
        "-F",
        "qcow2",
        s(&top),
    ]);
    io(&top, "write -P 0x21 2M 4M");
    io(&top, "write -z 40M 512k");
    let mut maps = Vec::new();
    for program in ["qemu-storage-daemon", OURS] {
        let nbd = dir.path().join("nbd.sock");
        let args = [
            "--blockdev",
            &format!("driver=file,node-name=file0,filename={}", s(&top)),
            "--blockdev",
            "driver=qcow2,node-name=disk0,file=file0",
            "--nbd-server",
            &format!("addr.type=unix,addr.path={}", s(&nbd)),
            "--export",
            "type=nbd,id=exp0,node-name=disk0,name=disk,allocation-depth=on",
        ]
        .map(String::from);
        let daemon = launch(program, args.to_vec(), dir.path(), &[&nbd]);
        let uri = unix_uri(&nbd, "disk");
        let mut seen = Vec::new();
        for context in ["qemu:allocation-depth", "base:allocation"] {
            let out = Command::new("nbdinfo")
                .args([&format!("--map={context}"), &uri])
                .output()
                .expect("nbdinfo (install libnbd-bin)");
            assert!(out.status.success(), "{program}: {out:?}");
            seen.push(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        maps.push(seen);
        drop(daemon);
    }
    // Depth 1 where the overlay holds data or zeros, 2 where only the backing file does, 0
    // where no layer does; and both contexts on one connection, as qemu-img asks for them.
    assert_eq!(maps[0], maps[1]);
    assert!(
        maps[1][0].contains("  2  "),
        "no depth-2 range: {}",
        maps[1][0]
    );
}
