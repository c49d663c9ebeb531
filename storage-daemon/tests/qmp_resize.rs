//! `block_resize` over QMP: the disk grows under a connected vhost-user frontend, which is
//! told with `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` on the backend channel it gave and reads
//! the new capacity back with `GET_CONFIG`; nodes no export serves are resized too; errors
//! are QEMU's; and the same commands given to qemu-storage-daemon leave the same sizes.
//!
//! Needs `qemu-img` and `qemu-storage-daemon` (Debian's `qemu-utils`; `.ci/run` installs it).

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aio_test_support::launch::{Daemon as Launched, Launch};
use qmp_client::Qmp;
use serde_json::{json, Value};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

const MIB: u64 = 1 << 20;
const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
/// `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG`'s request code.
const CONFIG_CHANGE_MSG: u32 = 2;
/// The header flag asking the frontend for an ack.
const NEED_REPLY: u32 = 1 << 3;

/// The images of one run: a raw file (exported), a qcow2 image and a null node (not).
struct Images {
    dir: tempfile::TempDir,
    raw: PathBuf,
    qcow2: PathBuf,
}

fn images() -> Images {
    let (dir, raw) = common::image(64 * MIB);
    let qcow2 = dir.path().join("disk.qcow2");
    common::qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        qcow2.to_str().unwrap(),
        "16M",
    ]);
    Images { dir, raw, qcow2 }
}

/// Starts `program` with the raw image exported as `exp0` (when `export`) and the other nodes
/// unexported.
fn start(program: &str, images: &Images, export: bool) -> (Launched, PathBuf, PathBuf) {
    let dir = images.dir.path();
    let (disk, monitor) = (dir.join("disk.sock"), dir.join("qmp.sock"));
    let mut args = vec![
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=file0,filename={},cache.direct=on",
            images.raw.display()
        ),
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=qfile,filename={},cache.direct=on",
            images.qcow2.display()
        ),
        "--blockdev".to_string(),
        "driver=qcow2,node-name=q0,file=qfile".to_string(),
        "--blockdev".to_string(),
        "driver=null-co,node-name=null0,size=1048576,read-zeroes=on".to_string(),
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ];
    let mut launch = Launch::new(program);
    if export {
        args.push("--export".to_string());
        args.push(format!(
            "type=vhost-user-blk,id=exp0,node-name=file0,addr.type=unix,addr.path={},\
             writable=on",
            disk.display()
        ));
        launch = launch.socket(disk.clone());
    }
    let daemon = launch
        .args(args)
        .label(program)
        .log_to(dir.join("log"))
        .socket(monitor.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    (daemon, disk, monitor)
}

/// Each node's `virtual-size`, by name.
fn sizes(q: &mut Qmp) -> Vec<(String, u64)> {
    let nodes = q.ok("query-named-block-nodes", json!({}));
    let mut out: Vec<(String, u64)> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node-name"].as_str().unwrap().to_string(),
                n["image"]["virtual-size"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

/// A frontend that took `BACKEND_REQ` and gave the daemon a backend channel; returns it and
/// the channel's frontend end.
fn frontend_with_channel(socket: &Path) -> (Frontend, UnixStream) {
    let mut f = Frontend::connect(socket, 1).expect("connect the frontend");
    f.set_owner().unwrap();
    let features = f.get_features().unwrap();
    f.set_features(features).unwrap();
    let offered = f.get_protocol_features().unwrap();
    let wanted = VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::BACKEND_REQ;
    assert!(offered.contains(wanted), "offered {offered:?}");
    f.set_protocol_features(wanted).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    f.set_backend_request_fd(&theirs).unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    (f, ours)
}

/// The next message header on the backend channel: request, flags, payload size.
fn message(channel: &mut UnixStream) -> [u32; 3] {
    let mut header = [0u8; 12];
    channel
        .read_exact(&mut header)
        .expect("a message on the backend channel");
    [0, 1, 2].map(|i| u32::from_le_bytes(header[i * 4..i * 4 + 4].try_into().unwrap()))
}

/// The capacity the frontend reads from the config space, in sectors.
fn capacity(f: &mut Frontend) -> u64 {
    let (_, bytes) = f
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0u8; 8])
        .unwrap();
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

#[test]
fn a_resize_reaches_the_connected_frontend_over_the_backend_channel() {
    let images = images();
    let (daemon, disk, monitor) = start(OURS, &images, true);
    let (mut frontend, mut channel) = frontend_with_channel(&disk);
    assert_eq!(capacity(&mut frontend), 64 * MIB / 512);
    let (mut q, _) = Qmp::connect(&monitor, false);
    q.ok(
        "block_resize",
        json!({"node-name": "file0", "size": 128 * MIB}),
    );

    // The message: a header (request, flags, size), no payload, no ack asked.
    let [request, flags, size] = message(&mut channel);
    assert_eq!(request, CONFIG_CHANGE_MSG);
    assert_eq!(flags & NEED_REPLY, 0, "flags {flags:#x}");
    assert_eq!(size, 0, "payload size");
    assert_eq!(capacity(&mut frontend), 128 * MIB / 512);
    assert_eq!(std::fs::metadata(&images.raw).unwrap().len(), 128 * MIB);

    // Shrinking is told the same way.
    q.ok(
        "block_resize",
        json!({"node-name": "file0", "size": 32 * MIB}),
    );
    assert_eq!(message(&mut channel)[0], CONFIG_CHANGE_MSG);
    assert_eq!(capacity(&mut frontend), 32 * MIB / 512);

    // A frontend gone, the disk still resizes (where qemu-storage-daemon 10.0.2 dies of a
    // SIGSEGV: an exported node resized with no client connected); the next frontend reads
    // the new size.
    drop((frontend, channel));
    q.ok(
        "block_resize",
        json!({"node-name": "file0", "size": 48 * MIB}),
    );
    let mut next = Frontend::connect(&disk, 1).expect("the next frontend");
    next.set_owner().unwrap();
    let features = next.get_features().unwrap();
    next.set_features(features).unwrap();
    next.get_protocol_features().unwrap();
    next.set_protocol_features(VhostUserProtocolFeatures::CONFIG)
        .unwrap();
    assert_eq!(capacity(&mut next), 48 * MIB / 512);
    drop(next);
    assert!(daemon.stop().unwrap().success());
}

#[test]
fn unexported_nodes_resize_and_refusals_name_why() {
    let images = images();
    let (daemon, _, monitor) = start(OURS, &images, true);
    let (mut q, _) = Qmp::connect(&monitor, false);
    q.ok("block_resize", json!({"node-name": "q0", "size": 48 * MIB}));
    let sizes = sizes(&mut q);
    assert!(sizes.contains(&("q0".into(), 48 * MIB)), "{sizes:?}");
    let refused = |q: &mut Qmp, args: Value| q.error("block_resize", args);
    let e = refused(&mut q, json!({"node-name": "null0", "size": 4 * MIB}));
    assert!(e.1.contains("does not support resize"), "{e:?}");
    let e = refused(&mut q, json!({"node-name": "file0", "size": 1000}));
    assert!(e.1.contains("multiple of 512"), "{e:?}");
    let e = refused(&mut q, json!({"node-name": "file0", "size": "big"}));
    assert!(e.1.contains("'size'"), "{e:?}");
    // The guest's size is the qcow2 node's, not its file's, once exported.
    q.ok(
        "block-export-add",
        json!({"type": "vhost-user-blk", "id": "exp1", "node-name": "q0", "writable": true,
               "addr": {"type": "unix", "path": images.dir.path().join("q.sock")}}),
    );
    let e = refused(&mut q, json!({"node-name": "qfile", "size": 64 * MIB}));
    assert!(e.1.contains("resize 'q0'"), "{e:?}");
    q.ok("block_resize", json!({"node-name": "q0", "size": 80 * MIB}));
    // A read-only export's disk is not resized.
    let ro = images.dir.path().join("ro.img");
    std::fs::File::create(&ro)
        .and_then(|f| f.set_len(MIB))
        .unwrap();
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "ro0", "filename": ro,
               "cache": {"direct": true}}),
    );
    q.ok(
        "block-export-add",
        json!({"type": "vhost-user-blk", "id": "exp2", "node-name": "ro0",
               "addr": {"type": "unix", "path": images.dir.path().join("ro.sock")}}),
    );
    let e = refused(&mut q, json!({"node-name": "ro0", "size": 8 * MIB}));
    assert!(e.1.contains("read-only"), "{e:?}");
    assert_eq!(std::fs::metadata(&ro).unwrap().len(), MIB);
    assert!(daemon.stop().unwrap().success());
    let info = common::qemu_img(&["info", images.qcow2.to_str().unwrap()]);
    assert!(info.contains("virtual size: 80 MiB"), "{info}");
    let check = common::qemu_img(&["check", images.qcow2.to_str().unwrap()]);
    assert!(check.contains("No errors were found"), "{check}");
}

#[test]
fn the_same_resizes_leave_the_same_sizes_and_errors_as_qemu_storage_daemon() {
    if !common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let mut runs = Vec::new();
    for program in [OURS, "qemu-storage-daemon"] {
        let images = images();
        // Nothing exported: qemu-storage-daemon 10.0.2 crashes (SIGSEGV) resizing an exported
        // node while no client is connected.
        let (daemon, _, monitor) = start(program, &images, false);
        let (mut q, _) = Qmp::connect(&monitor, false);
        q.ok(
            "block_resize",
            json!({"node-name": "file0", "size": 96 * MIB}),
        );
        q.ok("block_resize", json!({"node-name": "q0", "size": 40 * MIB}));
        let errors = [
            json!({"node-name": "null0", "size": 2 * MIB}),
            json!({"node-name": "nope", "size": MIB}),
            json!({"device": "nope", "size": MIB}),
            json!({"node-name": "file0", "size": -1}),
            json!({"node-name": "file0"}),
        ]
        .map(|args| q.error("block_resize", args));
        runs.push((sizes(&mut q), errors));
        assert!(daemon.stop().unwrap().success(), "{program}");
        let raw = std::fs::metadata(&images.raw).unwrap().len();
        assert_eq!(raw, 96 * MIB, "{program}");
    }
    // A qcow2 file's own length after a grow is where each implementation put the new L1
    // table: not compared.
    let guest_sizes = |run: &Vec<(String, u64)>| -> Vec<(String, u64)> {
        run.iter().filter(|(n, _)| n != "qfile").cloned().collect()
    };
    let (ours, theirs) = (&runs[0], &runs[1]);
    assert_eq!(
        guest_sizes(&ours.0),
        guest_sizes(&theirs.0),
        "virtual sizes: ours, then QEMU's"
    );
    assert_eq!(ours.1, theirs.1, "errors: ours, then QEMU's");
}
