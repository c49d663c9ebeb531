//! A real Linux guest as the test client of a vhost-user-blk socket.
//!
//! `scripts/build-guest.sh` builds, from Debian packages only, a kernel (Debian's cloud kernel)
//! and an initramfs whose init checks `/dev/vda`: its size, serial and queue count, fio write +
//! crc32c verify (queue depth 1, then 16 deep on both queues), mkfs.ext4 + mount + file
//! write / drop caches / read back, fsck, remount and read again, blkdiscard; or, for a
//! read-only disk, that it is read-only, readable and refuses writes. Each check prints a
//! `GUEST-CHECK name PASS|FAIL detail` line on the serial console, then the guest powers off.
//! These tests boot that guest under `qemu-system-x86_64` (TCG only: this machine's `/dev/kvm`
//! is paravirtual and does not boot stock kernels) against a socket and assert every check.
//!
//! The guest files are built once into `target/guest/` under the workspace root and reused.
//! Where QEMU or the packages cannot be had the tests print `skipped: <reason>` and pass,
//! unless `AIO_REQUIRE_ALL_BACKENDS=1` says nothing may be skipped.
//!
//! `guest_against_qemu_storage_daemon` (ignored) runs the same guest against QEMU's own
//! vhost-user-blk export, as the reference the daemon is measured against:
//! `cargo test -p aio-vhost-user-blk --test guest -- --ignored`.

use aio_core::testing::skip;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

#[path = "guest/reaped.rs"]
mod reaped;
use reaped::Reaped;

/// Size of the disk image the guest gets: 256 MiB.
const CAPACITY: u64 = 256 << 20;
/// The serial the daemon is given and the guest must read back.
const SERIAL: &str = "aio-guest-1";
/// Request queues: the daemon serves this many, QEMU's device asks for as many, and the
/// guest (with as many vCPUs) uses them all.
const QUEUES: u32 = 2;
/// How long one boot may take, from QEMU's start to the guest's power-off. A boot takes
/// seconds; this only bounds a hung guest or device.
const GUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a daemon may take to create its socket.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);

/// The checks a read-write disk must pass, in the order the guest runs them.
const RW_CHECKS: &[&str] = &[
    "vda",
    "size",
    "serial",
    "queues",
    "fio-verify",
    "fio-verify-qd16",
    "mkfs",
    "mount",
    "file-readback",
    "umount",
    "fsck",
    "file-remount",
    "discard",
];
/// The checks a read-only disk must pass, in the order the guest runs them.
const RO_CHECKS: &[&str] = &[
    "vda",
    "size",
    "serial",
    "queues",
    "readonly",
    "read",
    "write-refused",
];

/// The built guest: what QEMU boots, and where console logs go.
struct GuestImage {
    /// Debian's cloud kernel.
    kernel: PathBuf,
    /// The initramfs with the checking init.
    initrd: PathBuf,
    /// Directory for the console log of each boot (kept after the test for a look).
    logs: PathBuf,
}

/// The workspace's root: this crate's parent directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// Runs `scripts/build-guest.sh target/guest` once per test process (it is itself cached
/// between runs) and gives the guest, or `None` after reporting a skip when the script says
/// what it needs cannot be had here (its exit code 2). Panics for any other failure.
fn guest_image() -> Option<&'static GuestImage> {
    static IMAGE: OnceLock<Result<GuestImage, String>> = OnceLock::new();
    let built = IMAGE.get_or_init(|| {
        let root = workspace_root();
        let out = root.join("target").join("guest");
        let script = root.join("vhost-user-blk/scripts/build-guest.sh");
        let started = Instant::now();
        let output = Command::new("bash")
            .arg(&script)
            .arg(&out)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stderr = String::from_utf8_lossy(&output.stderr);
        match output.status.code() {
            Some(0) => {}
            Some(2) => {
                let last = stderr.lines().last().unwrap_or("").to_string();
                return Err(format!("the guest cannot be built here: {last}"));
            }
            _ => panic!("{} failed ({}):\n{stderr}", script.display(), output.status),
        }
        println!(
            "guest built or checked in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let logs = out.join("logs");
        fs::create_dir_all(&logs).expect("create target/guest/logs");
        Ok(GuestImage {
            kernel: out.join("vmlinuz"),
            initrd: out.join("initramfs.cpio.gz"),
            logs,
        })
    });
    match built {
        Ok(image) => Some(image),
        Err(reason) => {
            skip(reason);
            None
        }
    }
}

/// Whether `program` can be run (found on PATH and answers `--version`).
fn runnable(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What the guest is told to expect and the test asserts.
struct GuestSpec<'a> {
    /// The vhost-user-blk socket QEMU connects to.
    socket: &'a Path,
    /// The disk's capacity in bytes.
    capacity: u64,
    /// The serial the disk must report; `None`: the guest reports it, nothing asserts it
    /// (qemu-storage-daemon's export cannot be given one).
    serial: Option<&'a str>,
    /// Request queues QEMU's device asks for and the guest must see.
    queues: u32,
    /// A read-only disk: the read-only checks instead of the write checks.
    readonly: bool,
}

/// One `GUEST-CHECK` line.
#[derive(Debug)]
struct Check {
    /// The check's name.
    name: String,
    /// `PASS` (true) or `FAIL` (false).
    passed: bool,
    /// What the guest saw.
    detail: String,
}

/// What one boot printed.
struct GuestRun {
    /// The `GUEST-CHECK` lines, in order.
    checks: Vec<Check>,
    /// Whether the guest printed `GUEST-DONE` (it ran to the end).
    done: bool,
    /// Whether QEMU had to be killed at [`GUEST_TIMEOUT`].
    timed_out: bool,
    /// The whole console, QEMU's own messages included.
    console: String,
    /// Where the console was saved.
    log: PathBuf,
    /// How long the boot took, QEMU's start to its exit.
    elapsed: Duration,
}

/// Boots the guest under QEMU (TCG) with one vhost-user-blk disk on `spec.socket`, waits for
/// its power-off (at most [`GUEST_TIMEOUT`], then QEMU is killed) and parses its console.
/// `name` names the console log in `target/guest/logs/`.
fn run_guest(image: &GuestImage, spec: &GuestSpec, name: &str) -> GuestRun {
    let mut append = format!(
        "console=ttyS0 panic=-1 aio.size={} aio.queues={}",
        spec.capacity, spec.queues
    );
    if let Some(serial) = spec.serial {
        assert!(
            !serial.is_empty() && !serial.contains(char::is_whitespace),
            "the serial goes on the kernel command line: no spaces"
        );
        append.push_str(&format!(" aio.serial={serial}"));
    }
    if spec.readonly {
        append.push_str(" aio.readonly=1");
    }
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-nodefaults", "-no-user-config"])
        .args(["-machine", "q35,accel=tcg", "-cpu", "max"])
        .args(["-smp", &spec.queues.to_string(), "-m", "512"])
        .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
        .args(["-numa", "node,memdev=mem"])
        .arg("-chardev")
        .arg(format!("socket,id=c0,path={}", spec.socket.display()))
        .arg("-device")
        .arg(format!(
            "vhost-user-blk-pci,chardev=c0,num-queues={}",
            spec.queues
        ))
        .arg("-kernel")
        .arg(&image.kernel)
        .arg("-initrd")
        .arg(&image.initrd)
        .args(["-append", &append])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .arg("-no-reboot")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut qemu = Reaped {
        child: Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}")),
        ),
        name: "qemu-system-x86_64".to_string(),
        log: image.logs.join(format!("{name}.log")),
    };
    let child = qemu.child.as_mut().expect("just started");

    // The console (stdout) line by line through a channel, so waiting for it has a deadline;
    // QEMU's own messages (stderr) are read whole at the end.
    let (tx, rx) = mpsc::channel::<String>();
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let reader = std::thread::spawn(move || {
        let mut line = Vec::new();
        loop {
            line.clear();
            match stdout.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    if tx.send(text.trim_end().to_string()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut stderr = child.stderr.take().expect("piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let deadline = started + GUEST_TIMEOUT;
    let mut console = String::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                console.push_str(&line);
                console.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
        }
    }
    // QEMU exits at the guest's power-off; after a timeout (or a console closed early) it is
    // killed.
    let mut child = qemu.child.take().expect("running");
    let status = if timed_out {
        let _ = child.kill();
        child.wait().ok()
    } else {
        let wait_from = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break Some(status);
            }
            if wait_from.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                break child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let elapsed = started.elapsed();
    let _ = reader.join();
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    if timed_out {
        console.push_str(&format!(
            "\n[test: the guest did not power off within {GUEST_TIMEOUT:?}; QEMU killed]\n"
        ));
    }
    if !qemu_stderr.is_empty() {
        console.push_str("\n[QEMU's stderr]\n");
        console.push_str(&qemu_stderr);
    }
    if let Some(status) = status.filter(|s| !s.success()) {
        console.push_str(&format!("\n[QEMU exited: {status}]\n"));
    }
    let _ = fs::write(&qemu.log, &console);

    let mut checks = Vec::new();
    let mut done = false;
    for line in console.lines() {
        // Kernel messages may share the line: the marker is looked for anywhere in it.
        if let Some(at) = line.find("GUEST-CHECK ") {
            let mut parts = line[at + "GUEST-CHECK ".len()..].splitn(3, ' ');
            let name = parts.next().unwrap_or("").to_string();
            let passed = parts.next() == Some("PASS");
            let detail = parts.next().unwrap_or("").to_string();
            checks.push(Check {
                name,
                passed,
                detail,
            });
        } else if line.contains("GUEST-DONE") {
            done = true;
        }
    }
    GuestRun {
        checks,
        done,
        timed_out,
        console,
        log: qemu.log.clone(),
        elapsed,
    }
}

impl GuestRun {
    /// Asserts that the guest ran to the end and that each check `spec` calls for passed
    /// (the serial's only when `spec.serial` is given); panics with the failed checks, the
    /// guest's logs and the end of the console otherwise.
    fn assert_passed(&self, spec: &GuestSpec) {
        let expected = if spec.readonly { RO_CHECKS } else { RW_CHECKS };
        let mut problems = Vec::new();
        if self.timed_out {
            problems.push(format!(
                "the guest did not power off within {GUEST_TIMEOUT:?}: QEMU was killed"
            ));
        }
        if !self.done {
            problems.push("the guest did not print GUEST-DONE".to_string());
        }
        for name in expected {
            let found: Vec<&Check> = self.checks.iter().filter(|c| c.name == *name).collect();
            match found.as_slice() {
                [] => problems.push(format!("{name}: missing")),
                [c] if c.passed => {}
                [c] if *name == "serial" && spec.serial.is_none() => {
                    println!("serial not asserted: {}", c.detail);
                }
                [c] => problems.push(format!("{name}: FAIL {}", c.detail)),
                _ => problems.push(format!("{name}: reported {} times", found.len())),
            }
        }
        for c in &self.checks {
            if !expected.contains(&c.name.as_str()) {
                problems.push(format!("unexpected check {}: {}", c.name, c.detail));
            }
        }
        if problems.is_empty() {
            println!(
                "guest: {} checks passed in {:.1} s (console: {})",
                self.checks.len(),
                self.elapsed.as_secs_f64(),
                self.log.display()
            );
            for line in self.console.lines().filter(|l| l.contains("GUEST-INFO")) {
                println!("{}", line.trim());
            }
            return;
        }
        let logs: Vec<&str> = self
            .console
            .lines()
            .filter(|l| l.contains("GUEST-LOG") || l.contains("GUEST-INFO"))
            .collect();
        let lines: Vec<&str> = self.console.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        panic!(
            "the guest's checks failed after {:.1} s:\n  {}\n{}\n--- the console's last lines \
             (whole console: {}) ---\n{tail}",
            self.elapsed.as_secs_f64(),
            problems.join("\n  "),
            logs.join("\n"),
            self.log.display()
        );
    }
}

/// Creates a sparse image file of `size` bytes in `dir`.
fn make_image(dir: &Path, size: u64) -> PathBuf {
    let path = dir.join("disk.img");
    File::create(&path)
        .and_then(|f| f.set_len(size))
        .expect("create the image");
    path
}

/// Starts our daemon on `socket` serving `image` with the extra `--disk` options `extra`
/// (such as `,readonly=on`), and waits for the socket.
fn start_daemon(dir: &Path, socket: &Path, image: &Path, extra: &str) -> Reaped {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aio-vhost-user-blk"));
    cmd.arg("--disk").arg(format!(
        "socket={},image={},serial={SERIAL},queues={QUEUES}{extra}",
        socket.display(),
        image.display()
    ));
    let mut daemon = Reaped::spawn("aio-vhost-user-blk", cmd, dir.join("daemon.log"));
    daemon.wait_for_socket(socket);
    daemon
}

/// Stops our daemon with SIGTERM and asserts it exits with status 0 (its documented answer
/// to SIGTERM), that the image kept its size, and shows the daemon's output.
fn stop_daemon(mut daemon: Reaped, image: &Path) {
    let status = daemon.terminate();
    let output = daemon.output();
    if !output.is_empty() {
        println!("daemon output:\n{output}");
    }
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("the daemon exited with {s} after SIGTERM; output:\n{output}"),
        None => panic!("the daemon did not exit within 10 s of SIGTERM; output:\n{output}"),
    }
    let len = fs::metadata(image).expect("the image is still there").len();
    assert_eq!(len, CAPACITY, "the image changed size");
}

/// Boots the guest against our daemon's disk (`readonly=on` when `readonly`), as the run
/// `name`: every check must pass.
fn guest_against_our_daemon(readonly: bool, name: &str) {
    let Some(image) = guest_image() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = make_image(dir.path(), CAPACITY);
    let socket = dir.path().join("vhost-user-blk.sock");
    let extra = if readonly { ",readonly=on" } else { "" };
    let daemon = start_daemon(dir.path(), &socket, &disk, extra);
    let spec = GuestSpec {
        socket: &socket,
        capacity: CAPACITY,
        serial: Some(SERIAL),
        queues: QUEUES,
        readonly,
    };
    run_guest(image, &spec, name).assert_passed(&spec);
    stop_daemon(daemon, &disk);
}

/// Boots the guest against our daemon's read-write disk: every check must pass.
#[test]
fn guest_checks_the_daemons_disk() {
    guest_against_our_daemon(false, "daemon-rw");
}

/// Boots the guest against our daemon's disk with `readonly=on`: the guest sees a read-only
/// disk it can read.
#[test]
fn guest_checks_the_daemons_read_only_disk() {
    guest_against_our_daemon(true, "daemon-ro");
}

/// The reference: the same guest against qemu-storage-daemon's vhost-user-blk export, read
/// write and then read-only. Its serial cannot be set, so that check is reported only.
#[test]
#[ignore = "reference run against qemu-storage-daemon; run with --ignored"]
fn guest_against_qemu_storage_daemon() {
    let Some(image) = guest_image() else { return };
    if !runnable("qemu-storage-daemon") {
        skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    for readonly in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = make_image(dir.path(), CAPACITY);
        let socket = dir.path().join("qsd.sock");
        let ro = if readonly { ",read-only=on" } else { "" };
        let mut cmd = Command::new("qemu-storage-daemon");
        cmd.arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=file0,filename={},cache.direct=on{ro}",
                disk.display()
            ))
            .arg("--blockdev")
            .arg(format!("driver=raw,node-name=disk0,file=file0{ro}"))
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path={},\
                 writable={},num-queues={QUEUES}",
                socket.display(),
                if readonly { "off" } else { "on" }
            ));
        let mut qsd = Reaped::spawn("qemu-storage-daemon", cmd, dir.path().join("qsd.log"));
        qsd.wait_for_socket(&socket);
        let spec = GuestSpec {
            socket: &socket,
            capacity: CAPACITY,
            serial: None,
            queues: QUEUES,
            readonly,
        };
        let name = if readonly { "qsd-ro" } else { "qsd-rw" };
        run_guest(image, &spec, name).assert_passed(&spec);
        let _ = qsd.terminate();
    }
}
