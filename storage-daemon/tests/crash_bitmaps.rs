//! A persistent dirty bitmap through a SIGKILL: the same command line (a qcow2 node with
//! bitmap `b`, exported writable over NBD), the same writes through `qemu-io` over NBD, then
//! SIGKILL, against qemu-storage-daemon and ours. QEMU leaves the bitmap `in-use`
//! (inconsistent: an incremental backup from it is refused); ours leaves it consistent, and
//! qemu-storage-daemon then serves it (`qemu:dirty-bitmap:b` over NBD, read by `nbdinfo`)
//! with every written granule dirty and nothing outside the runs of 64 granules it makes
//! durable at once; `qemu-img check` finds the image clean.
//!
//! A bitmap added over QMP (`block-dirty-bitmap-add` with `persistent: true`, a backup
//! checkpoint as libvirt makes one) is in the file at once and survives the SIGKILL the same
//! way; qemu-storage-daemon, which stores it only at a clean close, loses it.
//!
//! Needs `qemu-img`, `qemu-io`, `qemu-storage-daemon` and `nbdinfo` (`.ci/run` installs them).

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aio_test_support::images::image_dir;
use aio_test_support::launch::{Daemon, Launch, LaunchError};
use aio_test_support::tool::{installed, run_in};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
const QSD: &str = "qemu-storage-daemon";
const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// The writes: `(offset, len)`, at 64 KiB granules (QEMU's default for 64 KiB clusters).
const WRITES: [(u64, u64); 4] = [
    (MIB, 4 * KIB),
    (10 * MIB + 60 * KIB, 8 * KIB),
    (33 * MIB, 512),
    (63 * MIB, 64 * KIB),
];

/// The dirty extents a crash leaves of the writes: each write's granules widened to their run
/// of 64 granules (4 MiB at 64 KiB), what ours makes durable at once (`aio-block`'s
/// `qcow2/durable.rs`): a superset of every written granule, nothing outside the runs.
const DIRTY: [(u64, u64); 4] = [
    (0, 4 * MIB),
    (8 * MIB, 4 * MIB),
    (32 * MIB, 4 * MIB),
    (60 * MIB, 4 * MIB),
];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `program` on `args` in `dir` (its log there), once `socket` accepts connections.
fn launch(
    program: &str,
    args: Vec<String>,
    dir: &Path,
    socket: &Path,
) -> Result<Daemon, LaunchError> {
    launch_on(program, args, dir, &[socket])
}

/// `program` on `args` in `dir` (its log there), once every one of `sockets` accepts
/// connections.
fn launch_on(
    program: &str,
    args: Vec<String>,
    dir: &Path,
    sockets: &[&Path],
) -> Result<Daemon, LaunchError> {
    let mut launch = Launch::new(program)
        .args(args)
        .label(program)
        .log_to(dir.join(format!("{}.log", program.rsplit('/').next().unwrap())))
        .socket_wait(Duration::from_secs(20));
    for socket in sockets {
        launch = launch.socket(socket.to_path_buf());
    }
    launch.start()
}

/// The command line serving `image` over NBD at `socket` as export `disk` (writable unless
/// `bitmap`, which then is served as `qemu:dirty-bitmap:NAME`).
fn args(image: &Path, socket: &Path, bitmap: Option<&str>) -> Vec<String> {
    let ro = if bitmap.is_some() {
        ",read-only=on"
    } else {
        ""
    };
    let export = match bitmap {
        None => "type=nbd,id=e,node-name=q,name=disk,writable=on".to_string(),
        Some(b) => format!("type=nbd,id=e,node-name=q,name=disk,bitmaps.0={b}"),
    };
    [
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=f,filename={},cache.direct=on{ro}",
            s(image)
        ),
        "--blockdev".to_string(),
        format!("driver=qcow2,node-name=q,file=f{ro}"),
        "--nbd-server".to_string(),
        format!("addr.type=unix,addr.path={}", s(socket)),
        "--export".to_string(),
        export,
    ]
    .to_vec()
}

/// `qemu-io` over NBD export `disk` at `socket` running `commands`.
fn qemu_io(socket: &Path, commands: &[String]) {
    let uri = format!("nbd+unix:///disk?socket={}", s(socket));
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.arg(&uri).output().expect("qemu-io");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("failed"),
        "qemu-io: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The flags `qemu-img info` shows for bitmap `b` of `image`.
fn flags(dir: &Path, image: &Path) -> serde_json::Value {
    let out = run_in(dir, "qemu-img", &["info", "--output=json", s(image)]);
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    let bitmaps = &info["format-specific"]["data"]["bitmaps"];
    assert_eq!(bitmaps[0]["name"], "b", "{info}");
    bitmaps[0]["flags"].clone()
}

/// The steps against `program`: a 64 MiB qcow2 image with bitmap `b` (made by `qemu-img`,
/// or, `over_qmp`, added persistent over QMP once served), served, written over NBD, then
/// killed. The image.
fn written_then_killed(program: &str, dir: &Path, over_qmp: bool) -> PathBuf {
    run_in(
        dir,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "d.qcow2", "64M"],
    );
    if !over_qmp {
        run_in(dir, "qemu-img", &["bitmap", "--add", "d.qcow2", "b"]);
    }
    let image = dir.join("d.qcow2");
    let (socket, monitor) = (dir.join("nbd.sock"), dir.join("qmp.sock"));
    let mut command_line = args(&image, &socket, None);
    command_line.extend([
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", s(&monitor)),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ]);
    let daemon = launch_on(program, command_line, dir, &[&socket, &monitor])
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut q, _) = qmp_client::Qmp::connect(&monitor, false);
    if over_qmp {
        q.ok(
            "block-dirty-bitmap-add",
            serde_json::json!({"node": "q", "name": "b", "persistent": true}),
        );
    }
    let writes: Vec<String> = WRITES
        .iter()
        .map(|(o, l)| format!("write -P 0x5a {o} {l}"))
        .collect();
    qemu_io(&socket, &writes);
    // Every write has completed (qemu-io waited for each); no flush, no clean stop.
    let status = daemon
        .stop_with(nix::sys::signal::Signal::SIGKILL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{program}: {status}"
    );
    image
}

/// What qemu-storage-daemon says when it refuses to serve bitmap `b` of `image` (it must
/// exit, within 20 s).
fn refused_export(dir: &Path, image: &Path) -> String {
    let socket = dir.join("refused.sock");
    let out = Command::new("timeout")
        .arg("20")
        .arg(QSD)
        .args(args(image, &socket, Some("b")))
        .output()
        .expect("qemu-storage-daemon");
    assert!(!out.status.success(), "{QSD} served an in-use bitmap");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The dirty extents of `qemu:dirty-bitmap:b` that qemu-storage-daemon serves from `image`.
fn served_dirty(dir: &Path, image: &Path) -> Vec<(u64, u64)> {
    let socket = dir.join("read.sock");
    let mut qsd = launch(QSD, args(image, &socket, Some("b")), dir, &socket)
        .unwrap_or_else(|e| panic!("{e}"));
    let uri = format!("nbd+unix:///disk?socket={}", s(&socket));
    let out = Command::new("nbdinfo")
        .args(["--map=qemu:dirty-bitmap:b", &uri])
        .output()
        .expect("nbdinfo");
    qsd.kill();
    assert!(
        out.status.success(),
        "nbdinfo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                [offset, len, "1", ..] => Some((offset.parse().unwrap(), len.parse().unwrap())),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn a_persistent_bitmap_survives_sigkill_consistent_with_every_write_where_qemus_is_in_use() {
    for tool in ["qemu-img", "qemu-io", QSD, "nbdinfo"] {
        if !installed(tool) {
            aio_conformance::skip(&format!("{tool} is not installed"));
            return;
        }
    }
    // QEMU: in use, and refused.
    let theirs = image_dir("crash-bitmaps");
    let image = written_then_killed(QSD, theirs.path(), false);
    assert_eq!(
        flags(theirs.path(), &image),
        serde_json::json!(["in-use", "auto"])
    );
    let refused = refused_export(theirs.path(), &image);
    assert!(refused.contains("Bitmap 'b' is inconsistent"), "{refused}");

    // Ours: consistent, every written granule dirty (in its run), nothing else; the image clean.
    let ours = image_dir("crash-bitmaps");
    let image = written_then_killed(OURS, ours.path(), false);
    assert_eq!(flags(ours.path(), &image), serde_json::json!(["auto"]));
    run_in(ours.path(), "qemu-img", &["check", "-q", s(&image)]);
    assert_eq!(served_dirty(ours.path(), &image), DIRTY.to_vec());
    // And the data written is there.
    let reads: Vec<String> = WRITES
        .iter()
        .map(|(o, l)| format!("read -P 0x5a {o} {l}"))
        .collect();
    let mut io = Command::new("qemu-io");
    io.args(["-f", "qcow2", "-r"]);
    for r in &reads {
        io.args(["-c", r]);
    }
    let out = io.arg(&image).output().expect("qemu-io");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !said.contains("fail"), "{said}");
}

/// The bitmaps `qemu-img info` lists in `image` (null: none).
fn listed(dir: &Path, image: &Path) -> serde_json::Value {
    let out = run_in(dir, "qemu-img", &["info", "--output=json", s(image)]);
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    info["format-specific"]["data"]["bitmaps"].clone()
}

#[test]
fn a_bitmap_added_over_qmp_survives_sigkill_where_qemu_loses_it() {
    for tool in ["qemu-img", "qemu-io", QSD, "nbdinfo"] {
        if !installed(tool) {
            aio_conformance::skip(&format!("{tool} is not installed"));
            return;
        }
    }
    let theirs = image_dir("crash-bitmaps");
    let image = written_then_killed(QSD, theirs.path(), true);
    assert_eq!(
        listed(theirs.path(), &image),
        serde_json::Value::Null,
        "QEMU stores it at a clean close only"
    );

    let ours = image_dir("crash-bitmaps");
    let image = written_then_killed(OURS, ours.path(), true);
    assert_eq!(flags(ours.path(), &image), serde_json::json!(["auto"]));
    run_in(ours.path(), "qemu-img", &["check", "-q", s(&image)]);
    assert_eq!(served_dirty(ours.path(), &image), DIRTY.to_vec());
}
