//! The pieces of a live-migration run (`tests/guest_migrate.rs`): the guest's initramfs with
//! `migrate-init.sh` as its init, a QEMU (TCG, its serial console on a pipe, a QMP monitor),
//! a daemon serving the disk with a monitor (ours or qemu-storage-daemon, in
//! qemu-storage-daemon's command-line form), and one migration between two QEMUs with the
//! daemons' handover at `pre-switchover`.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aio_test_support::launch::{Daemon, Launch, LaunchError};
use serde_json::{json, Value};

use crate::harness::{checks_of, spawn, GuestImage, GuestRun, GUEST_TIMEOUT, SOCKET_TIMEOUT};
use crate::qmp_client::Qmp;

/// The guest's RAM, as QEMU's memfd backend takes it.
const RAM: &str = "512M";
/// The longest a migration may take from `migrate` to `completed`: only bounds a hang.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(600);
/// After this long without reaching `pre-switchover` the downtime limit is raised (a slow
/// machine whose guest dirties its RAM faster than it is sent still converges).
const CONVERGE_AFTER: Duration = Duration::from_secs(90);

/// The built guest's initramfs with `migrate-init.sh` as `/init`: a second cpio archive
/// appended (the kernel unpacks both, the later `/init` replacing the first), written in
/// `dir`.
pub fn migrate_initrd(image: &GuestImage, dir: &Path) -> PathBuf {
    let init = include_bytes!("migrate-init.sh");
    let mut extra = newc("init", init, 0o100_755);
    extra.extend(newc("TRAILER!!!", b"", 0));
    // gzip members concatenated are one stream to the kernel's unpacker.
    let raw = dir.join("migrate-init.cpio");
    fs::write(&raw, &extra).expect("write the init's archive");
    let gz = Command::new("gzip")
        .args(["-n", "-c"])
        .arg(&raw)
        .output()
        .expect("gzip");
    assert!(gz.status.success(), "gzip: {gz:?}");
    let mut out = fs::read(&image.initrd).expect("read the guest's initramfs");
    out.extend(gz.stdout);
    let path = dir.join("initramfs-migrate.cpio.gz");
    fs::write(&path, out).expect("write the initramfs");
    path
}

/// One entry of a cpio archive in the `newc` format.
fn newc(name: &str, data: &[u8], mode: u32) -> Vec<u8> {
    let fields = [
        1,
        mode,
        0,
        0,
        1,
        0,
        data.len() as u32,
        0,
        0,
        0,
        0,
        name.len() as u32 + 1,
        0,
    ];
    let mut out = b"070701".to_vec();
    for f in fields {
        out.extend(format!("{f:08x}").as_bytes());
    }
    out.extend(name.as_bytes());
    out.push(0);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend(data);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// One QEMU of a run: the guest on a vhost-user-blk disk, its serial console read into a
/// string (and written to by [`Vm::say`]), its QMP monitor.
pub struct Vm {
    /// `src`, `dst`, `back`: for messages and file names.
    pub label: String,
    qemu: Daemon,
    stdin: Option<ChildStdin>,
    /// QEMU's monitor.
    pub qmp: Qmp,
    console: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

/// What every QEMU of a run is given alike (a migration's two ends must be the same machine).
pub struct Machine<'a> {
    /// The built guest (its kernel).
    pub image: &'a GuestImage,
    /// The initramfs with the migration init.
    pub initrd: &'a Path,
    /// The kernel command line.
    pub append: &'a str,
    /// Request queues, and vCPUs.
    pub queues: u32,
    /// The run's directory (sockets, QEMU's stderr).
    pub dir: &'a Path,
}

impl Vm {
    /// Starts QEMU on the disk `served` exports (vhost-user-blk, or QEMU's NBD client under
    /// a virtio-blk device); with `incoming` it waits for a migration (`-incoming defer`)
    /// instead of booting.
    pub fn start(m: &Machine, label: &str, served: &Served, incoming: bool) -> Vm {
        let monitor = m.dir.join(format!("qemu-{label}.qmp"));
        let _ = fs::remove_file(&monitor);
        let mut launch = Launch::new("qemu-system-x86_64")
            .label(format!("qemu-system-x86_64 ({label})"))
            .args(["-nodefaults", "-no-user-config"])
            .args(["-machine", "q35,accel=tcg", "-cpu", "max"])
            .args(["-smp", &m.queues.to_string(), "-m", RAM])
            .args([
                "-object",
                &format!("memory-backend-memfd,id=mem,size={RAM},share=on"),
            ])
            .args(["-numa", "node,memdev=mem"])
            .args(served.export.qemu_args(&served.socket, m.queues))
            .args(["-kernel", &m.image.kernel.display().to_string()])
            .args(["-initrd", &m.initrd.display().to_string()])
            .args(["-append", m.append])
            .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", monitor.display()))
            .arg("-no-reboot")
            .log_to(m.dir.join(format!("qemu-{label}.stderr")))
            .pipe_stdin()
            .pipe_stdout();
        if incoming {
            launch = launch.args(["-incoming", "defer"]);
        }
        let mut qemu = spawn(launch);
        let stdin = qemu.take_stdin();
        let mut stdout = qemu.take_stdout().expect("piped");
        let console = Arc::new(Mutex::new(String::new()));
        let reader = {
            let console = console.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = stdout.read(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    console.lock().unwrap().push_str(&text);
                }
            })
        };
        qemu.wait_for_socket(&monitor, SOCKET_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
        let (qmp, _) = Qmp::connect(&monitor, false);
        Vm {
            label: label.to_string(),
            qemu,
            stdin,
            qmp,
            console,
            reader: Some(reader),
        }
    }

    /// The console so far.
    pub fn console(&self) -> String {
        self.console.lock().unwrap().clone()
    }

    /// Waits until the console holds `marker` `count` times; panics (with the console's
    /// end) when QEMU exits first or after `timeout`.
    pub fn wait_for(&mut self, marker: &str, count: usize, timeout: Duration) {
        let started = Instant::now();
        loop {
            let console = self.console();
            if console.matches(marker).count() >= count {
                return;
            }
            let exited = self.qemu.try_wait().ok().flatten();
            if exited.is_some() || started.elapsed() > timeout {
                let tail: Vec<&str> = console.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "QEMU ({}) {} before its console showed {marker:?} {count} times; \
                     QEMU's stderr:\n{}\nthe console's end:\n{}",
                    self.label,
                    match exited {
                        Some(status) => format!("exited ({status})"),
                        None => format!("ran {timeout:?}"),
                    },
                    self.qemu.log(),
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes `line` to the guest's serial console.
    pub fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("QEMU's stdin");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .expect("write to the guest's console");
    }

    /// Waits for QEMU to exit by itself (the guest's power-off) for at most `timeout`, then
    /// kills it; its status (None: killed) and the whole console.
    pub fn wait_exit(mut self, timeout: Duration) -> (Option<ExitStatus>, String) {
        let status = self.qemu.wait_exit(timeout);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let console = self.console.lock().unwrap().clone();
        (status, console)
    }

    /// `quit` over QMP (a source left paused after its migration); its console.
    pub fn quit(mut self) -> String {
        let _ = self.qmp.call("quit", json!({}));
        self.wait_exit(Duration::from_secs(30)).1
    }

    /// QEMU's own messages (its stderr) so far.
    pub fn stderr(&self) -> String {
        self.qemu.log()
    }
}

/// A daemon serving the run's disk: the process, its monitor, its export's socket.
pub struct Served {
    /// The process.
    pub daemon: Daemon,
    /// Its monitor.
    pub qmp: Qmp,
    /// How it exports the disk.
    pub export: Export,
    /// Its export's socket (vhost-user-blk's, or the NBD server's).
    pub socket: PathBuf,
}

/// How a daemon of a run exports the disk, and so how QEMU attaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// A vhost-user-blk export: QEMU's `vhost-user-blk-pci` on its socket.
    VhostUserBlk,
    /// An NBD export named `disk` on the daemon's NBD server: QEMU's NBD client
    /// (`-blockdev driver=nbd`) under a `virtio-blk-pci` device, as QEMU's
    /// `tests/qsd-migrate` attaches it.
    Nbd,
}

impl Export {
    /// The daemon's `--export` (and `--nbd-server`) options for `node` on `socket`.
    fn daemon_args(self, node: &str, socket: &Path, queues: u32, inactive_ok: bool) -> Vec<String> {
        let allow = if inactive_ok {
            ",allow-inactive=on"
        } else {
            ""
        };
        match self {
            Export::VhostUserBlk => vec![
                "--export".into(),
                format!(
                    "type=vhost-user-blk,id=e,node-name={node},addr.type=unix,addr.path={},\
                     writable=on,num-queues={queues}{allow}",
                    socket.display()
                ),
            ],
            Export::Nbd => vec![
                "--nbd-server".into(),
                format!("addr.type=unix,addr.path={}", socket.display()),
                "--export".into(),
                format!("type=nbd,id=e,node-name={node},name=disk,writable=on{allow}"),
            ],
        }
    }

    /// QEMU's options attaching the disk on `socket` as the guest's virtio disk with `queues`
    /// request queues.
    fn qemu_args(self, socket: &Path, queues: u32) -> Vec<String> {
        match self {
            Export::VhostUserBlk => vec![
                "-chardev".into(),
                format!("socket,id=c0,path={}", socket.display()),
                "-device".into(),
                format!("vhost-user-blk-pci,id=vblk0,chardev=c0,num-queues={queues}"),
            ],
            Export::Nbd => vec![
                "-blockdev".into(),
                format!(
                    "driver=nbd,node-name=disk0,server.type=unix,server.path={},export=disk",
                    socket.display()
                ),
                "-device".into(),
                format!("virtio-blk-pci,id=vblk0,drive=disk0,num-queues={queues}"),
            ],
        }
    }
}

/// How a daemon of a run holds the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Its nodes active, its export `allow-inactive=on`: a source, handed over.
    Active,
    /// Its nodes `active=off`, its export `allow-inactive=on`: a destination, handed over.
    Inactive,
    /// Its nodes active, its export without `allow-inactive` (qemu-storage-daemon 10.0's
    /// vhost-user-blk export refuses it: "Export type does not support inactive exports"),
    /// both daemons writing the one raw image at once, as its exports share write.
    Shared,
}

/// `program` (ours or qemu-storage-daemon) serving `nodes` (`--blockdev` options, the last
/// exported) as an `export` in `role`, with a monitor; named `label` in `dir`.
pub fn serve(
    program: &str,
    label: &str,
    dir: &Path,
    nodes: &[String],
    (export, queues): (Export, u32),
    role: Role,
) -> Result<Served, LaunchError> {
    let socket = dir.join(format!("{label}.sock"));
    let monitor = dir.join(format!("{label}.qmp"));
    let mut args = Vec::new();
    for node in nodes {
        args.push("--blockdev".to_string());
        args.push(format!(
            "{node}{}",
            if role == Role::Inactive {
                ",active=off"
            } else {
                ""
            }
        ));
    }
    let exported = nodes
        .last()
        .and_then(|n| n.split(',').find_map(|kv| kv.strip_prefix("node-name=")))
        .expect("a node-name in the last node");
    args.extend(export.daemon_args(exported, &socket, queues, role != Role::Shared));
    args.extend([
        "--chardev".to_string(),
        format!("socket,id=m,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "chardev=m".to_string(),
    ]);
    let daemon = Launch::new(program)
        .args(args)
        .label(format!("{program} ({label})"))
        .log_to(dir.join(format!("{label}.log")))
        .socket(socket.clone())
        .socket(monitor.clone())
        .socket_wait(SOCKET_TIMEOUT)
        .start()?;
    let (qmp, _) = Qmp::connect(&monitor, false);
    Ok(Served {
        daemon,
        qmp,
        export,
        socket,
    })
}

/// Each node's `active`, by node name, from `query-named-block-nodes`.
pub fn active_nodes(qmp: &mut Qmp) -> Vec<(String, bool)> {
    let nodes = qmp.ok("query-named-block-nodes", json!({"flat": true}));
    nodes
        .as_array()
        .expect("a list of nodes")
        .iter()
        .map(|n| {
            let name = n["node-name"].as_str().unwrap_or("?").to_string();
            (name, n["active"].as_bool().unwrap_or(false))
        })
        .collect()
}

/// The next message on `qmp` (an event: no command is under way), waiting at most `wait`;
/// None when none came (or the monitor closed). Replies are waited for 20 s again after it.
fn next_message(qmp: &mut Qmp, wait: Duration) -> Option<Value> {
    let timeout = |qmp: &mut Qmp, t: Duration| {
        qmp.writer
            .set_read_timeout(Some(t))
            .expect("set the monitor's timeout")
    };
    timeout(qmp, wait);
    let message = qmp.line();
    timeout(qmp, Duration::from_secs(20));
    message
}

/// What one migration took, as QEMU's `query-migrate` reports it and as the test timed it.
#[derive(Debug, Clone)]
pub struct Migrated {
    /// Which way (`src -> dst`).
    pub label: String,
    /// QEMU's `downtime` (ms): the source stopped to the destination running, the handover
    /// at `pre-switchover` included.
    pub downtime_ms: u64,
    /// QEMU's `total-time` (ms).
    pub total_ms: u64,
    /// RAM bytes sent.
    pub transferred: u64,
    /// The two `blockdev-set-active` calls, as the test timed them.
    pub handover: Duration,
}

/// Migrates `from` to `to` (started with `-incoming defer`) over a unix socket in `dir`, with
/// `events` and `pause-before-switchover`: at `pre-switchover` the disk is handed over
/// (`blockdev-set-active active=false` on the old daemon, `active=true` on the new one; none
/// for [`Role::Shared`] daemons), then `migrate-continue`. Panics unless the migration
/// completes and the destination runs.
pub fn migrate(
    from: &mut Vm,
    to: &mut Vm,
    mut handover_of: Option<(&mut Served, &mut Served)>,
    dir: &Path,
) -> Migrated {
    let label = format!("{} -> {}", from.label, to.label);
    let uri = format!(
        "unix:{}",
        dir.join(format!("migrate-{}.sock", to.label)).display()
    );
    let caps = |names: &[&str]| {
        let list: Vec<Value> = names
            .iter()
            .map(|c| json!({"capability": c, "state": true}))
            .collect();
        json!({ "capabilities": list })
    };
    to.qmp.ok("migrate-set-capabilities", caps(&["events"]));
    to.qmp.ok("migrate-incoming", json!({ "uri": uri }));
    from.qmp.ok(
        "migrate-set-capabilities",
        caps(&["events", "pause-before-switchover"]),
    );
    from.qmp.ok(
        "migrate-set-parameters",
        json!({"max-bandwidth": 1u64 << 30}),
    );
    // A QEMU that came in by a migration has that one's events still to read: drained, so
    // that its `completed` is not taken for this one's.
    while next_message(&mut from.qmp, Duration::from_millis(100)).is_some() {}
    from.qmp.events.clear();
    from.qmp.ok("migrate", json!({ "uri": uri }));

    // The source's MIGRATION events (the `events` capability), each acted on as it comes:
    // from `pre-switchover` on the guest is stopped, so a poll's sleep would be downtime.
    let started = Instant::now();
    let mut raised = false;
    let mut handover = None;
    let end = loop {
        let event = match from.qmp.events.is_empty() {
            false => Some(from.qmp.events.remove(0)),
            true => next_message(&mut from.qmp, Duration::from_millis(100)),
        };
        if event.is_none() {
            // Half a second without a message, or the monitor closed: is QEMU still there?
            if let Ok(Some(status)) = from.qemu.try_wait() {
                panic!("{label}: the source exited ({status}):\n{}", from.stderr());
            }
        }
        let status = event
            .as_ref()
            .filter(|e| e["event"] == "MIGRATION")
            .and_then(|e| e["data"]["status"].as_str());
        match status {
            Some(end @ ("completed" | "failed" | "cancelled")) => break end.to_string(),
            Some("pre-switchover") if handover.is_none() => {
                let at = Instant::now();
                if let Some((old, new)) = handover_of.as_mut() {
                    old.qmp.ok("blockdev-set-active", json!({"active": false}));
                    new.qmp.ok("blockdev-set-active", json!({"active": true}));
                }
                handover = Some(at.elapsed());
                from.qmp
                    .ok("migrate-continue", json!({"state": "pre-switchover"}));
            }
            _ => {}
        }
        if !raised && started.elapsed() > CONVERGE_AFTER {
            raised = true;
            println!("{label}: not converged after {CONVERGE_AFTER:?}; downtime-limit 10 s");
            from.qmp
                .ok("migrate-set-parameters", json!({"downtime-limit": 10_000}));
        }
        if started.elapsed() > MIGRATION_TIMEOUT {
            let q = from.qmp.ok("query-migrate", json!({}));
            panic!("{label}: no end within {MIGRATION_TIMEOUT:?}: {q}");
        }
    };
    let status = from.qmp.ok("query-migrate", json!({}));
    assert_eq!(end, "completed", "{label}: {status}");
    assert_eq!(
        status["status"],
        "completed",
        "{label}: {status}\nsource's stderr:\n{}\ndestination's stderr:\n{}",
        from.stderr(),
        to.stderr()
    );
    let handover = handover.expect("the migration paused at pre-switchover");
    // The destination runs the guest by itself once the state is in (no -S).
    let started = Instant::now();
    loop {
        let s = to.qmp.ok("query-status", json!({}));
        if s["status"] == "running" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{label}: the destination is {s} after the migration"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let number = |v: &Value| v.as_u64().unwrap_or(0);
    let m = Migrated {
        label,
        downtime_ms: number(&status["downtime"]),
        total_ms: number(&status["total-time"]),
        transferred: number(&status["ram"]["transferred"]),
        handover,
    };
    println!(
        "{}: completed in {} ms, downtime {} ms (handover {:.1} ms), {} MiB sent",
        m.label,
        m.total_ms,
        m.downtime_ms,
        m.handover.as_secs_f64() * 1e3,
        m.transferred >> 20
    );
    m
}

/// The guest's run as the harness asserts it, from the consoles of the QEMUs it ran on (in
/// order: a line the switchover cut is whole again).
pub fn guest_run(
    consoles: &[String],
    timed_out: bool,
    log: PathBuf,
    elapsed: Duration,
) -> GuestRun {
    let console = consoles.concat();
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

/// The longest a guest may run on its last QEMU after it was told to stop.
pub const STOP_TIMEOUT: Duration = GUEST_TIMEOUT;

/// `qemu-img check` of a qcow2 image once no daemon holds it: what it said, or an error
/// unless it found nothing wrong at all (exit 0: no error, no leak).
pub fn qcow2_clean(disk: &Path) -> Result<String, String> {
    let out = Command::new("qemu-img")
        .arg("check")
        .arg(disk)
        .output()
        .expect("qemu-img check");
    let said = aio_test_support::tool::text(&out);
    match out.status.code() {
        Some(0) => Ok(said),
        code => Err(format!("qemu-img check exit {code:?}: {said}")),
    }
}
