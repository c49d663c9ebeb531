//! The guest test's harness: the guest built once, booted under QEMU (TCG) against a
//! vhost-user-blk socket, its console read line by line, its `GUEST-CHECK` lines asserted.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use aio_conformance::skip;
use aio_test_support::launch::{Daemon, Launch};

/// How long one boot may take, from QEMU's start to the guest's power-off. A boot takes
/// seconds; this only bounds a hung guest or device.
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a daemon may take to create its socket.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit after SIGTERM (then it is killed).
pub const SIGTERM_TIMEOUT: Duration = Duration::from_secs(10);
/// How long QEMU may take to exit once the guest's console has closed (then it is killed).
const QEMU_EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts `launch` (a daemon, QEMU) with the guest tests' waits: [`SOCKET_TIMEOUT`] for its
/// sockets, [`SIGTERM_TIMEOUT`] for its exit after SIGTERM. One that cannot be started, or
/// exits before its sockets appear, fails the test with its command line and what it said.
pub fn spawn(launch: Launch) -> Daemon {
    launch
        .socket_wait(SOCKET_TIMEOUT)
        .stop_wait(SIGTERM_TIMEOUT)
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The `--export` arguments (qemu-storage-daemon's form, which our daemon takes too) that
/// serve the node `disk0` on `socket` as a vhost-user-blk export of `queues` queues,
/// writable or not.
pub fn export_args(socket: &Path, queues: u32, writable: bool) -> [String; 2] {
    [
        "--export".to_string(),
        format!(
            "type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path={},\
             writable={},num-queues={queues}",
            socket.display(),
            if writable { "on" } else { "off" }
        ),
    ]
}

/// Stops `daemon` with SIGTERM and asserts it exits with status 0 (a daemon's documented
/// answer to SIGTERM); shows its output either way.
pub fn stop_cleanly(daemon: Daemon) {
    let label = daemon.label().to_string();
    match daemon.stop_cleanly() {
        Ok(output) if output.is_empty() => {}
        Ok(output) => println!("{label} output:\n{output}"),
        Err(e) => panic!("{e}"),
    }
}

/// The built guest: what QEMU boots, and where console logs go.
pub struct GuestImage {
    /// Debian's cloud kernel.
    pub kernel: PathBuf,
    /// The initramfs with the checking init.
    pub initrd: PathBuf,
    /// Directory for the console log of each boot (kept after the test for a look).
    pub logs: PathBuf,
}

/// The workspace's root: this crate's parent directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// Runs `scripts/build-guest.sh target/guest` once per test process (it is itself cached
/// between runs) and gives the guest, or `None` after reporting a skip when the script says
/// what it needs cannot be had here (its exit code 2). Panics for any other failure.
pub fn guest_image() -> Option<&'static GuestImage> {
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
pub use aio_test_support::tool::installed as runnable;

/// What the guest is told to expect and the test asserts.
pub struct GuestSpec<'a> {
    /// The vhost-user-blk socket QEMU connects to.
    pub socket: &'a Path,
    /// The disk's capacity in bytes.
    pub capacity: u64,
    /// The serial the disk must report; `None`: the guest reports it, nothing asserts it
    /// (qemu-storage-daemon's export cannot be given one).
    pub serial: Option<&'a str>,
    /// Request queues QEMU's device asks for and the guest must see.
    pub queues: u32,
    /// The checks the guest must pass, in its order (none more, none missing).
    pub checks: &'a [&'a str],
    /// More kernel command-line options for the guest's init (`aio.readonly=1`,
    /// `aio.mode=restart`...), space-separated.
    pub append: String,
    /// QEMU reconnects to the socket every 500 ms when the daemon goes away
    /// (`reconnect-ms=500`), keeping the guest's requests pending meanwhile.
    pub reconnect: bool,
    /// QEMU's human monitor on this unix socket (none: no monitor), for a test that reads
    /// the device's state in guest memory.
    pub monitor: Option<PathBuf>,
    /// The disk is this NBD export on `socket` instead (QEMU's NBD client under a
    /// virtio-blk-pci device with the same serial and queues).
    pub nbd_export: Option<&'a str>,
}

/// One `GUEST-CHECK` line.
#[derive(Debug)]
pub struct Check {
    /// The check's name.
    pub name: String,
    /// `PASS` (true) or `FAIL` (false).
    pub passed: bool,
    /// What the guest saw.
    pub detail: String,
}

/// What one boot printed.
pub struct GuestRun {
    /// The `GUEST-CHECK` lines, in order.
    pub checks: Vec<Check>,
    /// Whether the guest printed `GUEST-DONE` (it ran to the end).
    pub done: bool,
    /// Whether QEMU had to be killed at [`GUEST_TIMEOUT`].
    pub timed_out: bool,
    /// The whole console, QEMU's own messages included.
    pub console: String,
    /// Where the console was saved.
    pub log: PathBuf,
    /// How long the boot took, QEMU's start to its exit.
    pub elapsed: Duration,
}

/// The checks a read-write disk must pass, in the order the guest runs them.
pub const RW_CHECKS: &[&str] = &[
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

/// The checks of the replay workload (`aio.mode=replay`: the same writes on every run), in
/// its order.
pub const REPLAY_CHECKS: &[&str] = &[
    "vda",
    "size",
    "serial",
    "queues",
    "replay-fio",
    "replay-discard",
    "replay-zeroes",
    "replay-sum",
];

/// QEMU's arguments for the guest's disk: a vhost-user-blk device on `spec.socket`, or QEMU's
/// NBD client of `spec.nbd_export` there under a virtio-blk device.
fn disk_args(spec: &GuestSpec, reconnect: &str) -> Vec<String> {
    match spec.nbd_export {
        None => vec![
            "-chardev".into(),
            format!("socket,id=c0,path={}{reconnect}", spec.socket.display()),
            "-device".into(),
            format!(
                "vhost-user-blk-pci,id=vblk0,chardev=c0,num-queues={}",
                spec.queues
            ),
        ],
        Some(export) => vec![
            "-blockdev".into(),
            format!(
                "driver=nbd,node-name=nbd0,server.type=unix,server.path={},export={export}",
                spec.socket.display()
            ),
            "-device".into(),
            format!(
                "virtio-blk-pci,id=vblk0,drive=nbd0,num-queues={},serial={}",
                spec.queues,
                spec.serial.unwrap_or("nbd")
            ),
        ],
    }
}

/// Boots the guest under QEMU (TCG) with one vhost-user-blk disk on `spec.socket`, waits for
/// its power-off (at most [`GUEST_TIMEOUT`], then QEMU is killed) and parses its console.
/// `name` names the console log in `target/guest/logs/`; `on_line` sees each console line as
/// it comes (a test that acts on the guest's progress).
pub fn run_guest(
    image: &GuestImage,
    spec: &GuestSpec,
    name: &str,
    on_line: &mut dyn FnMut(&str),
) -> GuestRun {
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
    if !spec.append.is_empty() {
        append.push(' ');
        append.push_str(&spec.append);
    }
    let reconnect = if spec.reconnect {
        ",reconnect-ms=500"
    } else {
        ""
    };
    let launch = Launch::new("qemu-system-x86_64")
        .args(["-nodefaults", "-no-user-config"])
        .args(["-machine", "q35,accel=tcg", "-cpu", "max"])
        .args(["-smp", &spec.queues.to_string(), "-m", "512"])
        .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
        .args(["-numa", "node,memdev=mem"])
        .args(disk_args(spec, reconnect))
        .args(["-kernel", &image.kernel.display().to_string()])
        .args(["-initrd", &image.initrd.display().to_string()])
        .args(["-append", &append])
        .args(["-display", "none", "-serial", "stdio", "-monitor"])
        .arg(match &spec.monitor {
            Some(path) => format!("unix:{},server=on,wait=off", path.display()),
            None => "none".to_string(),
        })
        .arg("-no-reboot")
        .pipe_stdout()
        .pipe_stderr();
    let log = image.logs.join(format!("{name}.log"));
    let started = Instant::now();
    let mut qemu = spawn(launch);

    // The console (stdout) line by line through a channel, so waiting for it has a deadline;
    // QEMU's own messages (stderr) are read whole at the end.
    let (tx, rx) = mpsc::channel::<String>();
    let mut stdout = BufReader::new(qemu.take_stdout().expect("piped"));
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
    let mut stderr = qemu.take_stderr().expect("piped");
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
                on_line(&line);
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
    let status = if timed_out {
        qemu.kill()
    } else {
        qemu.wait_exit(QEMU_EXIT_TIMEOUT)
    };
    let lingered = !timed_out && status.is_none();
    let elapsed = started.elapsed();
    let _ = reader.join();
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    if timed_out {
        console.push_str(&format!(
            "\n[test: the guest did not power off within {GUEST_TIMEOUT:?}; QEMU killed]\n"
        ));
    }
    if lingered {
        console.push_str(&format!(
            "\n[test: QEMU did not exit within {QEMU_EXIT_TIMEOUT:?} of the console's end; \
             killed]\n"
        ));
    }
    if !qemu_stderr.is_empty() {
        console.push_str("\n[QEMU's stderr]\n");
        console.push_str(&qemu_stderr);
    }
    if let Some(status) = status.filter(|s| !s.success()) {
        console.push_str(&format!("\n[QEMU exited: {status}]\n"));
    }
    let _ = fs::write(&log, &console);

    let (checks, done) = checks_of(&console);
    GuestRun {
        checks,
        done,
        timed_out,
        console,
        log,
        elapsed,
    }
}

impl GuestRun {
    /// Asserts that the guest ran to the end and that each check `spec` calls for passed
    /// (the serial's only when `spec.serial` is given); panics with the failed checks, the
    /// guest's logs and the end of the console otherwise.
    pub fn assert_passed(&self, spec: &GuestSpec) {
        let expected = spec.checks;
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

    /// The value of `key` in the guest's `GUEST-INFO key=value` lines, if it printed one.
    pub fn info(&self, key: &str) -> Option<String> {
        let wanted = format!("{key}=");
        self.console
            .lines()
            .filter(|l| l.contains("GUEST-INFO"))
            .flat_map(|l| l.split_whitespace())
            .find_map(|w| w.strip_prefix(wanted.as_str()).map(str::to_string))
    }
}

/// The guest's `GUEST-CHECK NAME PASS|FAIL DETAIL` lines in `console`, and whether it said
/// `GUEST-DONE`. Kernel messages may share a line: the markers are looked for anywhere in it.
pub fn checks_of(console: &str) -> (Vec<Check>, bool) {
    let mut checks = Vec::new();
    let mut done = false;
    for line in console.lines() {
        if let Some(at) = line.find("GUEST-CHECK ") {
            let mut parts = line[at + "GUEST-CHECK ".len()..].splitn(3, ' ');
            checks.push(Check {
                name: parts.next().unwrap_or("").to_string(),
                passed: parts.next() == Some("PASS"),
                detail: parts.next().unwrap_or("").to_string(),
            });
        } else if line.contains("GUEST-DONE") {
            done = true;
        }
    }
    (checks, done)
}

/// Asks QEMU's human monitor at `socket` for each queue's ring indices in guest memory (avail
/// flags and index, used flags and index, the used ring's avail event), as one line per
/// queue, for a test that wants to know where a hung guest's requests are.
pub fn ring_state(socket: &Path, queues: u32) -> String {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let Ok(mut stream) = UnixStream::connect(socket) else {
        return format!("no monitor at {}", socket.display());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(800)));
    let mut ask = |command: &str| -> String {
        let _ = stream.write_all(format!("{command}\n").as_bytes());
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        strip_escapes(&String::from_utf8_lossy(&out))
    };
    ask("");
    let mut report = String::new();
    for q in 0..queues {
        let status = ask(&format!(
            "info virtio-vhost-queue-status /machine/peripheral/vblk0/virtio-backend {q}"
        ));
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        };
        let num = status
            .lines()
            .find_map(|l| l.trim().strip_prefix("num:"))
            .and_then(|v| v.trim().parse::<u64>().ok());
        let (Some(avail), Some(used), Some(num)) = (field("avail_phys:"), field("used_phys:"), num)
        else {
            report.push_str(&format!("queue {q}: no ring state ({status:?})\n"));
            continue;
        };
        let avail_head = ask(&format!("xp /2hx {avail:#x}"));
        let used_head = ask(&format!("xp /2hx {used:#x}"));
        let avail_event = ask(&format!("xp /1hx {:#x}", used + 4 + 8 * num));
        let last = |text: &str| {
            text.lines()
                .rfind(|l| l.starts_with('0'))
                .unwrap_or("")
                .to_string()
        };
        report.push_str(&format!(
            "queue {q}: avail flags,idx {} | used flags,idx {} | avail_event {}\n",
            last(&avail_head),
            last(&used_head),
            last(&avail_event)
        ));
    }
    report
}

/// `text` without terminal escape sequences (the monitor echoes with them).
fn strip_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}
