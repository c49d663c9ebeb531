//! QMP on the other character devices QEMU's tools give a monitor: a client socket (the
//! daemon connects to a socket the tool listens on, as qemu-iotests' `QemuStorageDaemon`
//! does) and `stdio` (commands on standard input, as `qsd-jobs` pipes them, from a pipe or a
//! file); and `--pidfile` with `--daemonize` in this daemon's own `--disk` form.

mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// A null node and a listening chardev beside the one under test, so that the daemon has a
/// graph to answer about.
fn daemon(extra: &[&str]) -> Command {
    let mut c = Command::new(OURS);
    c.args(["--blockdev", "null-co,node-name=n0,size=1M"])
        .args(extra);
    c
}

/// Waits at most 20 s for `child` to exit; its status.
fn exit_of(mut child: Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon did not exit within 20 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_client_chardev_connects_to_the_listening_tool_and_serves_qmp_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qsd-a.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let child = daemon(&[
        "--chardev",
        &format!("socket,id=qmp-sock,path={}", path.display()),
        "--monitor",
        "qmp-sock",
    ])
    .spawn()
    .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(listener.accept().map(|(s, _)| s));
    });
    let stream = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the daemon connects within 20 s")
        .unwrap();
    let (mut q, greeting) = Qmp::over(stream, false);
    assert!(greeting["QMP"]["version"].is_object(), "{greeting}");
    let nodes = q.ok("query-named-block-nodes", json!({"flat": true}));
    assert_eq!(nodes[0]["node-name"], "n0", "{nodes}");
    assert_eq!(q.ok("quit", json!({})), json!({}));
    // As qemu-storage-daemon: no SHUTDOWN event (the system emulator's); the connection ends.
    assert_eq!(q.line(), None);
    assert!(exit_of(child).success());
    assert!(
        path.exists(),
        "the tool's socket is the tool's: not removed"
    );
}

#[test]
fn a_client_chardev_nobody_listens_on_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nobody.sock");
    let out = daemon(&[
        "--chardev",
        &format!("socket,id=m,path={}", path.display()),
        "--monitor",
        "m",
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Failed to connect to"), "{stderr}");
}

/// The messages the daemon wrote to its standard output, one JSON object a line.
fn messages(stdout: &[u8]) -> Vec<Value> {
    stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(|l| serde_json::from_slice(l).expect("JSON on stdout"))
        .collect()
}

const COMMANDS: &str = r#"{"execute": "qmp_capabilities"}
{"execute": "query-named-block-nodes", "id": 1}
{"execute": "quit", "id": 2}
"#;

/// The greeting and the replies, in order, and nothing else (qemu-storage-daemon sends no
/// SHUTDOWN event).
fn check_session(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = messages(&out.stdout);
    assert!(m[0]["QMP"].is_object(), "{m:?}");
    assert_eq!(m[1], json!({"return": {}}));
    assert_eq!(m[2]["id"], 1);
    assert_eq!(m[2]["return"][0]["node-name"], "n0", "{m:?}");
    assert_eq!(m[3], json!({"return": {}, "id": 2}));
    assert_eq!(m.len(), 4, "{m:?}");
}

#[test]
fn a_stdio_monitor_reads_commands_from_a_pipe_and_answers_on_stdout() {
    let mut child = daemon(&["--chardev", "stdio,id=stdio", "--monitor", "chardev=stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // A daemon that never answers fails the test instead of hanging it: killed after 60 s,
    // its stdout ends.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (done, watchdog) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watchdog.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    });
    // One command at a time: each answered before the next is written.
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"QMP\""), "{line}");
    writeln!(stdin, r#"{{"execute": "qmp_capabilities"}}"#).unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&line).unwrap(),
        json!({"return": {}})
    );
    stdin
        .write_all(COMMANDS.split_once('\n').unwrap().1.as_bytes())
        .unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut stdout, &mut rest).unwrap();
    let m = messages(&rest);
    assert_eq!(m[0]["return"][0]["node-name"], "n0", "{m:?}");
    assert_eq!(m[1], json!({"return": {}, "id": 2}));
    assert_eq!(m.len(), 2, "{m:?}");
    let _ = done.send(());
    assert!(exit_of(child).success());
}

#[test]
fn a_stdio_monitor_reads_commands_from_a_file_as_from_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let commands = dir.path().join("commands");
    std::fs::write(&commands, COMMANDS).unwrap();
    let out = daemon(&["--chardev", "stdio,id=stdio", "--monitor", "chardev=stdio"])
        .stdin(std::fs::File::open(&commands).unwrap())
        .output()
        .unwrap();
    check_session(&out);
}

#[test]
fn the_disk_form_takes_pidfile_and_daemonize() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, pidfile) = (dir.path().join("d.sock"), dir.path().join("d.pid"));
    let status = Command::new(OURS)
        .current_dir(dir.path())
        .args(["--disk", "socket=d.sock,image=null,size=1M"])
        .args(["--pidfile", "d.pid", "--daemonize"])
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(socket.exists(), "the socket once --daemonize returned");
    common::terminate_daemonized(common::daemonized_pid(&pidfile));
    assert!(!pidfile.exists() && !socket.exists(), "removed at exit");
}
