//! `aio-bench vhost` as a user runs it, without our daemon: bad input exits 2 naming what is
//! wrong (found before anything connects or starts), and `--vs-qsd` reports a daemon of ours
//! that fails to start (exit 1, its status and output) and leaves nothing running.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;

mod common;

use common::{bench, expect_bad_input, text, TempDir};

#[test]
fn bad_input_exits_2_and_names_it() {
    let dir = TempDir::new("bad");
    // A socket nobody answers on: every case must fail before connecting to it.
    let sock = dir.0.join("s.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    let s = sock.to_str().unwrap();
    let img = dir.0.join("disk.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let i = img.to_str().unwrap();
    let comma = dir.0.join("a,b.img");
    std::fs::write(&comma, vec![0u8; 4096]).unwrap();
    let c = comma.to_str().unwrap();
    let d = dir.0.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["vhost"], "--socket"),
        (
            vec!["vhost", "--socket", "/nonexistent/v.sock"],
            "not an existing socket",
        ),
        (vec!["vhost", "--socket", d], "not an existing socket"),
        (vec!["vhost", "--socket", s, "--vs-qsd"], "--vs-qsd"),
        (
            vec!["vhost", "--socket", s, "--rounds", "3"],
            "--rounds needs --vs-qsd",
        ),
        (
            vec!["vhost", "--socket", s, "--disks", "1,16"],
            "--disks needs --vs-qsd",
        ),
        (
            vec!["vhost", "--socket", s, "--image", i],
            "--image needs --vs-qsd",
        ),
        (
            vec!["vhost", "--socket", s, "--device", "loop"],
            "--device needs --vs-qsd",
        ),
        (
            vec!["vhost", "--socket", s, "--engine", "uring"],
            "--engine needs --vs-qsd",
        ),
        (
            vec!["vhost", "--socket", s, "--fdmon", "epoll"],
            "--fdmon needs --vs-qsd",
        ),
        (
            vec!["vhost", "--socket", s, "--daemon-cpu", "0"],
            "--daemon-cpu needs",
        ),
        (
            vec!["vhost", "--socket", s, "--poll-max-ns", "0"],
            "--poll-max-ns needs",
        ),
        (vec!["vhost", "--daemon-pid", "1"], "--socket"),
        (
            vec!["vhost", "--socket", s, "--rw", "randtrim"],
            "--rw randtrim",
        ),
        (vec!["vhost", "--socket", s, "--rw", "sideways"], "sideways"),
        (vec!["vhost", "--socket", s, "--bs", "1000"], "--bs 1000"),
        (vec!["vhost", "--socket", s, "--bs", "4x"], "4x"),
        (vec!["vhost", "--socket", s, "--iodepth", "0"], "--iodepth"),
        (
            vec!["vhost", "--socket", s, "--iodepth", "257"],
            "--iodepth",
        ),
        (vec!["vhost", "--socket", s, "--queues", "0"], "--queues"),
        (
            vec!["vhost", "--socket", s, "--rwmixread", "101"],
            "--rwmixread",
        ),
        (
            vec!["vhost", "--socket", s, "--runtime", "0s"],
            "more than 0",
        ),
        (
            vec!["vhost", "--socket", s, "--client-cpu", "4000"],
            "--client-cpu 4000",
        ),
        (
            vec!["vhost", "--socket", s, "--daemon-pid", "2147483000"],
            "--daemon-pid 2147483000: no such process",
        ),
        (vec!["vhost", "--vs-qsd"], "--image PATH or --device"),
        (
            vec!["vhost", "--vs-qsd", "--image", "/nonexistent.img"],
            "--image /nonexistent.img",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", d],
            "not a file or a block device",
        ),
        (vec!["vhost", "--vs-qsd", "--image", c], "comma"),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--bs", "2m"],
            "smaller than --bs",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--device", "loop"],
            "--device",
        ),
        (vec!["vhost", "--vs-qsd", "--device", "nvme"], "nvme"),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--engine", "spdk"],
            "spdk",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--fdmon", "kqueue"],
            "kqueue",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--disks", "0"],
            "--disks",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--disks", "1,300"],
            "--disks",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--rounds", "0"],
            "--rounds",
        ),
        (
            vec!["vhost", "--vs-qsd", "--image", i, "--daemon-cpu", "4000"],
            "--daemon-cpu 4000",
        ),
    ];
    expect_bad_input(&cases);
}

/// A socket that accepts but never answers (a daemon busy with another client): the run
/// fails after the connection wait instead of hanging.
#[test]
fn a_silent_socket_fails_the_run_instead_of_hanging() {
    let dir = TempDir::new("silent");
    let sock = dir.0.join("s.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    let o = bench()
        .args(["vhost", "--socket", sock.to_str().unwrap()])
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("no answer within 10s"), "{t}");
}

#[test]
fn the_daemon_subcommand_is_hidden() {
    let o = bench().arg("--help").output().unwrap();
    let t = text(&o);
    assert!(t.contains("vhost"), "{t}");
    assert!(!t.contains("vhost-daemon"), "{t}");
}

/// qemu-storage-daemon runs its turn, then "ours" (here /bin/false, which exits 1 at once)
/// fails to start: exit code 1, the daemon, its exit status and its command line named, and
/// no daemon, socket or directory left behind.
#[test]
fn our_daemon_failing_to_start_is_reported() {
    let have_qsd = Command::new("qemu-storage-daemon")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_qsd || !std::path::Path::new("/dev/shm").is_dir() {
        aio_conformance::skip("qemu-storage-daemon and /dev/shm (O_DIRECT on tmpfs)");
        return;
    }
    let img = PathBuf::from(format!("/dev/shm/aio-vhost-cli-{}.img", std::process::id()));
    std::fs::write(&img, vec![0u8; 16 << 20]).unwrap();
    let o = bench()
        .args(["vhost", "--vs-qsd", "--image", img.to_str().unwrap()])
        .args([
            "--runtime",
            "200ms",
            "--ramp",
            "0s",
            "--rounds",
            "1",
            "--fdmon",
            "epoll",
        ])
        .env("AIO_BENCH_VHOST_DAEMON", "/bin/false")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&img);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("  1  qemu"), "QEMU's turn ran first: {t}");
    assert!(
        t.contains("ours/epoll exited (exit status: 1) before its socket"),
        "{t}"
    );
    assert!(
        t.contains("command: /bin/false vhost-daemon --disk socket="),
        "{t}"
    );
    assert!(t.contains("it printed nothing"), "{t}");
    let tag = format!("aio-bench-vhost-{}/", o_pid(&t));
    let run_dir = std::env::temp_dir().join(&tag);
    assert!(!run_dir.exists(), "{} left behind", run_dir.display());
    assert_eq!(
        processes_naming(&tag),
        Vec::<String>::new(),
        "daemons left running"
    );
}

/// The command lines of the processes whose arguments hold `needle`.
fn processes_naming(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(cmdline);
        }
    }
    found
}

/// The bench's PID, from the socket path in its message (`aio-bench-vhost-PID/`).
fn o_pid(t: &str) -> String {
    let at = t.find("aio-bench-vhost-").expect("the run directory named") + 16;
    t[at..].chars().take_while(char::is_ascii_digit).collect()
}
