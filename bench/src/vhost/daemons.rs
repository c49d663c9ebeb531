//! Starting and stopping the two vhost-user-blk daemons `aio-bench vhost --vs-qsd` compares:
//! qemu-storage-daemon and ours (the `aio-bench` binary re-executed as the hidden
//! `aio-bench vhost-daemon`, which runs `aio_storage_daemon::cli::main`).
//!
//! Both serve the same image (opened once per disk; QEMU with `locking=off`, since its disks
//! share the file) over one socket per disk, all disks on one iothread with the same
//! `poll-max-ns` and the same kind of I/O: QEMU's `aio=io_uring`, `aio=native` and
//! `aio=threads` for our engines `uring`, `linux-aio` and `pool`, O_DIRECT for both
//! (`cache.direct=on`; `driver=host_device` for a block device).
//!
//! Both are pinned alike, as `taskset` would: the child sets its CPU affinity between fork
//! and exec, so every thread it starts inherits it. The child also asks the kernel for
//! SIGKILL when the bench dies (`PR_SET_PDEATHSIG`), and a signal of the bench
//! ([`crate::targets::cleanup`]) kills it and waits for it: no daemon outlives the bench. A daemon is
//! started and stopped from the bench's main thread only (the death signal follows the thread
//! that started it).
//!
//! Starting, waiting for the sockets, reporting a daemon that exits early with its status,
//! command line and output, and stopping (SIGTERM, then SIGKILL) are
//! `aio_test_support`'s [`Launch`]; this module adds the two command lines, the
//! signal cleanup and a private directory for the sockets and logs ([`RunDir`]), removed
//! afterwards.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use aio_test_support::launch::{self, Launch};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::error::VhostError;
use crate::targets::cleanup::{self, OnSignal};
use aio::EngineKind;
use aio::MonitorKind;

/// qemu-storage-daemon's program name.
pub const QSD: &str = "qemu-storage-daemon";

/// Which daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonKind {
    /// qemu-storage-daemon.
    Qemu,
    /// Ours, with this fd monitor.
    Ours(MonitorKind),
}

impl DaemonKind {
    /// The name in reports: `qemu`, `ours/epoll`.
    pub fn label(self) -> String {
        match self {
            DaemonKind::Qemu => "qemu".into(),
            DaemonKind::Ours(m) => format!("ours/{}", m.name()),
        }
    }
}

/// QEMU's `aio=` for one of our engines.
pub fn qemu_aio(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Uring => "io_uring",
        EngineKind::LinuxAio => "native",
        EngineKind::Pool => "threads",
    }
}

/// What a daemon serves and how.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    /// Which daemon.
    pub kind: DaemonKind,
    /// The image every disk opens (a file, or a block device).
    pub image: PathBuf,
    /// The image is a block device (QEMU's `driver=host_device`).
    pub block_device: bool,
    /// The kind of I/O.
    pub engine: EngineKind,
    /// The iothread's adaptive polling limit.
    pub poll_max_ns: aio_loop::PollMaxNs,
    /// Virtqueues per disk.
    pub queues: usize,
    /// Disks (sockets), all on the one iothread.
    pub disks: usize,
    /// Pin the daemon (all its threads) to this CPU.
    pub cpu: Option<usize>,
}

impl DaemonSpec {
    /// Disk `i`'s socket in `dir`.
    pub fn socket(&self, dir: &Path, i: usize) -> PathBuf {
        let who = match self.kind {
            DaemonKind::Qemu => "qemu",
            DaemonKind::Ours(_) => "ours",
        };
        dir.join(format!("{who}-{i}.sock"))
    }

    /// The program and its arguments; `exe` is the `aio-bench` binary (for ours).
    pub fn command_line(&self, dir: &Path, exe: &Path) -> (PathBuf, Vec<String>) {
        let image = self.image.display().to_string();
        let sockets: Vec<String> = (0..self.disks)
            .map(|i| self.socket(dir, i).display().to_string())
            .collect();
        match self.kind {
            DaemonKind::Qemu => {
                let mut args = vec![
                    "--object".to_string(),
                    // QEMU has no automatic window: with `auto` it keeps its default.
                    format!(
                        "iothread,id=io0,poll-max-ns={}",
                        self.poll_max_ns
                            .fixed()
                            .unwrap_or(aio_loop::DEFAULT_POLL_MAX_NS)
                    ),
                ];
                let driver = if self.block_device {
                    "host_device"
                } else {
                    "file"
                };
                let aio = qemu_aio(self.engine);
                for (i, sock) in sockets.iter().enumerate() {
                    args.extend([
                        "--blockdev".into(),
                        format!(
                            "driver={driver},node-name=file{i},filename={image},\
                             cache.direct=on,aio={aio},locking=off"
                        ),
                        "--blockdev".into(),
                        format!("driver=raw,node-name=disk{i},file=file{i}"),
                        "--export".into(),
                        format!(
                            "type=vhost-user-blk,id=exp{i},node-name=disk{i},addr.type=unix,\
                             addr.path={sock},writable=on,num-queues={},iothread=io0",
                            self.queues
                        ),
                    ]);
                }
                (PathBuf::from(QSD), args)
            }
            DaemonKind::Ours(fdmon) => {
                let mut args = vec!["vhost-daemon".to_string()];
                for sock in &sockets {
                    args.push("--disk".into());
                    args.push(format!(
                        "socket={sock},image={image},queues={}",
                        self.queues
                    ));
                }
                args.extend([
                    "--engine".into(),
                    self.engine.name().into(),
                    "--fdmon".into(),
                    fdmon.name().into(),
                    "--iothreads".into(),
                    "1".into(),
                    "--poll-max-ns".into(),
                    self.poll_max_ns.to_string(),
                ]);
                (exe.to_path_buf(), args)
            }
        }
    }
}

/// The private directory of a run's sockets and daemon logs:
/// `TMPDIR/aio-bench-vhost-PID`, removed on drop and on a signal.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _on_signal: OnSignal,
}

impl RunDir {
    /// Makes the directory (first removing what killed runs left, [`cleanup::remove_dead_runs`]).
    pub fn new() -> Result<RunDir, VhostError> {
        let tmp = std::env::temp_dir();
        cleanup::remove_dead_runs(&tmp);
        let path = tmp.join(format!("aio-bench-vhost-{}", std::process::id()));
        let on_signal = {
            let p = path.clone();
            cleanup::on_signal(format!("{} removed", path.display()), move || {
                let _ = std::fs::remove_dir_all(&p);
            })
        };
        std::fs::create_dir_all(&path)
            .map_err(|e| VhostError::io(format!("creating {}", path.display()), e))?;
        Ok(RunDir {
            path,
            _on_signal: on_signal,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running daemon (`aio_test_support::launch`'s), killed when the bench is interrupted;
/// dropped without [`stop`](Daemon::stop), it is killed.
#[derive(Debug)]
pub struct Daemon {
    inner: launch::Daemon,
    _on_signal: OnSignal,
}

impl Daemon {
    /// Starts the daemon of `spec` with its sockets and log in `dir` (`exe`: the `aio-bench`
    /// binary, for ours) and waits until all its sockets exist.
    pub fn start(spec: &DaemonSpec, dir: &Path, exe: &Path) -> Result<Daemon, VhostError> {
        let label = spec.kind.label();
        let (program, args) = spec.command_line(dir, exe);
        let mut launch = Launch::new(program)
            .args(args)
            .log_to(dir.join(format!("{}.log", label.replace('/', "-"))))
            .pin_to(spec.cpu);
        for i in 0..spec.disks {
            launch = launch.socket(spec.socket(dir, i));
        }
        let inner = launch.label(label.clone()).start()?;
        let pid = inner.pid() as i32;
        let on_signal = cleanup::on_signal(format!("{label} (PID {pid}) killed"), move || {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            // SAFETY: waitpid on our own child only reaps it; the Child handle that also names
            // it is never used again, since the process exits after the undos.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        });
        Ok(Daemon {
            inner,
            _on_signal: on_signal,
        })
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// Its name in reports (`qemu`, `ours/epoll`).
    pub fn label(&self) -> &str {
        self.inner.label()
    }

    /// Disk `i`'s socket.
    pub fn socket(&self, i: usize) -> &Path {
        self.inner.socket(i)
    }

    /// Whether it is still running (an error says how it ended, with its log).
    pub fn check_running(&mut self) -> Result<(), VhostError> {
        Ok(self.inner.check_running()?)
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after a while); returns how it exited,
    /// and warns on stderr when that was not a clean exit.
    pub fn stop(self) -> Result<ExitStatus, VhostError> {
        let label = self.label().to_string();
        let status = self.inner.stop()?;
        if !status.success() && status.code().is_some() {
            eprintln!("aio-bench vhost: warning: {label} exited ({status}) after SIGTERM");
        }
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: DaemonKind) -> DaemonSpec {
        DaemonSpec {
            kind,
            image: "/dev/shm/x.img".into(),
            block_device: false,
            engine: EngineKind::LinuxAio,
            poll_max_ns: aio_loop::PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
            queues: 2,
            disks: 2,
            cpu: Some(0),
        }
    }

    #[test]
    fn both_command_lines_serve_the_same_disks_alike() {
        let dir = Path::new("/run/x");
        let (p, a) = spec(DaemonKind::Qemu).command_line(dir, Path::new("/bin/aio-bench"));
        assert_eq!(p, Path::new(QSD));
        let a = a.join(" ");
        assert!(a.contains("iothread,id=io0,poll-max-ns=32768"), "{a}");
        assert!(
            a.contains(
                "driver=file,node-name=file1,filename=/dev/shm/x.img,cache.direct=on,aio=native"
            ),
            "{a}"
        );
        assert!(a.contains("addr.path=/run/x/qemu-1.sock,writable=on,num-queues=2,iothread=io0"));
        let mut dev = spec(DaemonKind::Qemu);
        dev.block_device = true;
        let (_, a) = dev.command_line(dir, Path::new("x"));
        assert!(a.join(" ").contains("driver=host_device"));

        let (p, a) =
            spec(DaemonKind::Ours(MonitorKind::Epoll)).command_line(dir, Path::new("/b/aio-bench"));
        assert_eq!(p, Path::new("/b/aio-bench"));
        assert_eq!(
            a,
            [
                "vhost-daemon",
                "--disk",
                "socket=/run/x/ours-0.sock,image=/dev/shm/x.img,queues=2",
                "--disk",
                "socket=/run/x/ours-1.sock,image=/dev/shm/x.img,queues=2",
                "--engine",
                "linux-aio",
                "--fdmon",
                "epoll",
                "--iothreads",
                "1",
                "--poll-max-ns",
                "32768"
            ]
        );
    }

    /// A daemon that exits before its socket appears is reported with its status and what it
    /// printed; one that never makes it is killed after the wait.
    #[test]
    fn a_daemon_that_fails_to_start_says_why() {
        let dir = RunDir::new().unwrap();
        let sh = Path::new("/bin/sh");
        let mut s = spec(DaemonKind::Ours(MonitorKind::Epoll));
        s.cpu = None;
        // Ours is `exe vhost-daemon ARGS`: sh runs the script `vhost-daemon`, which is missing
        // (exit code 2, and it says so).
        let e = Daemon::start(&s, dir.path(), sh).unwrap_err();
        let t = e.to_string();
        assert!(t.contains("ours/epoll exited (exit status: 2)"), "{t}");
        assert!(
            t.contains("cannot open vhost-daemon"),
            "what it printed: {t}"
        );
        assert!(t.contains("before its socket"), "{t}");
        assert!(t.contains("vhost-daemon"), "{t}");
        assert!(!e.is_bad_input(), "{e:?}");
    }
}
