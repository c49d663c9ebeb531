//! qemu-storage-daemon's command line run by our binary: the same command line given to
//! qemu-storage-daemon and to `aio-storage-daemon` serves the same disks (sizes, read-only
//! or not, the same bytes after the same writes, images `qemu-img check` finds clean);
//! `--daemonize` and `--pidfile` behave as QEMU's; what is not served exits 2 naming it.
//!
//! Needs `qemu-img` and `qemu-storage-daemon` (Debian's `qemu-utils`; `.ci/run` installs it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aio_test_support::launch::{Daemon as Launched, Launch};
use common::{connect, connect_read_only, qemu_img};

/// A fresh directory in /dev/shm (O_DIRECT without a disk) holding a raw image and a qcow2
/// image of 64 MiB.
fn images() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = aio_test_support::images::memory_dir("qsd-cli");
    let raw = dir.path().join("disk.raw");
    let qcow2 = dir.path().join("disk.qcow2");
    qemu_img(&["create", "-q", "-f", "raw", raw.to_str().unwrap(), "64M"]);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        qcow2.to_str().unwrap(),
        "64M",
    ]);
    (dir, raw, qcow2)
}

/// The command line both daemons get: a raw image on an iothread with two queues, a qcow2
/// image, both writable, and a read-only null device, in `dir`. Returns it and the sockets.
fn command_line(dir: &Path, raw: &Path, qcow2: &Path) -> (Vec<String>, [PathBuf; 3]) {
    let sockets = ["raw.sock", "qcow2.sock", "null.sock"].map(|s| dir.join(s));
    let export = |id: &str, node: &str, socket: &Path, extra: &str| {
        format!(
            "type=vhost-user-blk,id={id},node-name={node},addr.type=unix,addr.path={}{extra}",
            socket.display()
        )
    };
    let line = [
        "--object".to_string(),
        "iothread,id=io0,poll-max-ns=16384".to_string(),
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=f0,filename={},cache.direct=on,aio=threads",
            raw.display()
        ),
        "--blockdev".to_string(),
        "driver=raw,node-name=raw0,file=f0".to_string(),
        "--blockdev".to_string(),
        format!(
            r#"{{"driver": "qcow2", "node-name": "q0", "file": {{"driver": "file",
                "filename": "{}", "cache": {{"direct": true}}, "aio": "threads"}}}}"#,
            qcow2.display()
        ),
        "--blockdev".to_string(),
        "driver=null-co,node-name=n0,size=16777216,read-zeroes=on".to_string(),
        "--export".to_string(),
        export(
            "e0",
            "raw0",
            &sockets[0],
            ",writable=on,num-queues=2,iothread=io0",
        ),
        "--export".to_string(),
        export("e1", "q0", &sockets[1], ",writable=on"),
        "--export".to_string(),
        export("e2", "n0", &sockets[2], ""),
    ];
    (line.to_vec(), sockets)
}

/// What a client sees of the three disks; the images hold what it wrote.
#[derive(Debug, PartialEq)]
struct Seen {
    capacities: Vec<u64>,
    null_read_only: bool,
    read_back: Vec<Vec<u8>>,
}

/// Connects to each disk: capacities, writes a pattern into the writable ones and reads it
/// back, and tries a writable connection to the read-only one.
fn drive(sockets: &[PathBuf; 3]) -> Seen {
    let mut capacities = Vec::new();
    let mut read_back = Vec::new();
    for (i, socket) in sockets[..2].iter().enumerate() {
        let mut c = connect(socket, 1, 1 << 20).unwrap();
        capacities.push(c.capacity().unwrap());
        let data: Vec<u8> = (0..1u32 << 20).map(|b| (b % 241) as u8 ^ i as u8).collect();
        c.write_buf(0, &data);
        c.write(0, 5 << 20, 0, 1 << 20, 1);
        assert_eq!(c.wait(0, 1), [(1, 0)]);
        c.fill_buf(0, 1 << 20, 0);
        c.read(0, 5 << 20, 0, 1 << 20, 2);
        assert_eq!(c.wait(0, 1), [(2, 0)]);
        read_back.push(c.read_buf(0, 1 << 20));
    }
    let null_read_only = connect(&sockets[2], 1, 4096).is_err();
    let c = connect_read_only(&sockets[2], 4096).unwrap();
    capacities.push(c.capacity().unwrap());
    Seen {
        capacities,
        null_read_only,
        read_back,
    }
}

/// Starts `program` with `line` and waits for the sockets.
fn start(program: &str, line: &[String], sockets: &[PathBuf; 3], log: PathBuf) -> Launched {
    let mut launch = Launch::new(program)
        .args(line.iter().cloned())
        .label(program)
        .log_to(log)
        .socket_wait(Duration::from_secs(20));
    for s in sockets {
        launch = launch.socket(s.clone());
    }
    launch.start().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_qemu_storage_daemon_command_line_serves_the_disks_qemu_storage_daemon_serves() {
    let mut seen = Vec::new();
    let mut dirs = Vec::new();
    let ours = env!("CARGO_BIN_EXE_aio-storage-daemon");
    for program in [ours, "qemu-storage-daemon"] {
        let (dir, raw, qcow2) = images();
        let (line, sockets) = command_line(dir.path(), &raw, &qcow2);
        let daemon = start(program, &line, &sockets, dir.path().join("log"));
        seen.push(drive(&sockets));
        let status = daemon.stop().unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success(), "{program} after SIGTERM: {status}");
        if program == ours {
            for s in &sockets {
                assert!(!s.exists(), "{program} left {}", s.display());
            }
        }
        let check = qemu_img(&["check", qcow2.to_str().unwrap()]);
        assert!(check.contains("No errors were found"), "{program}: {check}");
        dirs.push((dir, raw, qcow2));
    }
    assert_eq!(seen[0], seen[1], "ours, then qemu-storage-daemon's");
    assert_eq!(seen[0].capacities, [64 << 20, 64 << 20, 16 << 20]);
    assert!(seen[0].null_read_only, "an export without writable=on");
    let (ours, theirs) = (&dirs[0], &dirs[1]);
    assert_eq!(
        std::fs::read(&ours.1).unwrap(),
        std::fs::read(&theirs.1).unwrap(),
        "the raw images"
    );
    let (a, b) = (ours.2.to_str().unwrap(), theirs.2.to_str().unwrap());
    qemu_img(&["compare", "-f", "qcow2", "-F", "qcow2", a, b]);
}

/// Paths relative to the directory it is started in are served, and the daemon itself runs
/// in `/` (it keeps no directory busy), as qemu-storage-daemon.
#[test]
fn daemonize_returns_once_serving_and_the_pid_file_names_the_daemon() {
    let (dir, raw, _) = images();
    let socket = dir.path().join("d.sock");
    let pidfile = dir.path().join("d.pid");
    let status = Command::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
        .current_dir(dir.path())
        .arg("--blockdev")
        .arg(format!(
            "driver=file,node-name=f0,filename={},aio=threads",
            raw.file_name().unwrap().to_str().unwrap()
        ))
        .arg("--export")
        .arg("type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path=d.sock,writable=on")
        .arg("--pidfile")
        .arg("d.pid")
        .arg("--daemonize")
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    // Returned only once serving: the socket is there, the client is served at once.
    assert!(socket.exists(), "the socket once --daemonize returned");
    let pid = common::daemonized_pid(&pidfile);
    let c = connect(&socket, 1, 4096).unwrap();
    assert_eq!(c.capacity().unwrap(), 64 << 20);
    drop(c);
    common::terminate_daemonized(pid);
    assert!(!pidfile.exists(), "the pid file at exit");
    assert!(!socket.exists(), "the socket at exit");
}

#[test]
fn what_is_not_served_exits_2_naming_it_and_a_failed_daemonize_reports_it() {
    let (dir, raw, _) = images();
    let run = |args: &[String]| {
        let out = Command::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let file = format!("driver=file,node-name=f0,filename={}", raw.display());
    let export = |kind: &str| {
        vec![
            "--blockdev".to_string(),
            file.clone(),
            "--export".to_string(),
            format!("type={kind},id=e0,node-name=f0"),
        ]
    };
    let (code, said) = run(&export("fuse"));
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("'fuse' export"), "{said}");
    // An NBD export without the NBD server, as QEMU says it.
    let (code, said) = run(&export("nbd"));
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("NBD server not running"), "{said}");
    // A daemon that fails after the fork: the parent returns the child's code and message.
    let bad_image = vec![
        "--blockdev".to_string(),
        format!(
            "driver=file,node-name=f0,filename={}",
            dir.path().join("nope").display()
        ),
        "--export".to_string(),
        format!(
            "type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path={}",
            dir.path().join("x.sock").display()
        ),
        "--daemonize".to_string(),
    ];
    let (code, said) = run(&bad_image);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("nope"), "{said}");
}
