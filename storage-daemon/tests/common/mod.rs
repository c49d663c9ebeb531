//! Shared by the integration tests: the daemon binary started through
//! `aio_test_support::launch`, its libblkio client (`aio_vhost_user_blk::testing`), its image,
//! and the engines this kernel offers.

#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aio_test_support::launch::{Launch, LaunchError};
pub use aio_vhost_user_blk::testing::{Client, ClientConfig, ClientError};

/// The daemon binary, started with `args`; killed (SIGKILL) on drop if still running, and its
/// log shown then (in the test's captured output).
pub struct Daemon(Option<aio_test_support::launch::Daemon>);

impl Daemon {
    /// Starts the daemon and waits until every socket accepts connections.
    ///
    /// A daemon that could not build its io_uring ring within the locked-memory limit (a
    /// budget of the user, shared with the tests running beside this one, which give it back
    /// when they end) is started again, for up to 20 s; any other early exit fails the test
    /// with the daemon's message.
    pub fn start(args: &[String], sockets: Vec<PathBuf>) -> Daemon {
        Daemon::launch(args, sockets, false)
    }

    /// An upgrade: starts the daemon on the sockets a running daemon serves, and waits until
    /// each is the new daemon's.
    pub fn start_replacing(args: &[String], sockets: Vec<PathBuf>) -> Daemon {
        Daemon::launch(args, sockets, true)
    }

    fn launch(args: &[String], sockets: Vec<PathBuf>, replacing: bool) -> Daemon {
        let mut launch = Launch::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
            .args(args.iter().cloned())
            .label("the daemon")
            .socket_wait(Duration::from_secs(20));
        for s in sockets {
            launch = launch.socket(s);
        }
        if replacing {
            launch = launch.replacing();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match launch.start() {
                Ok(d) => return Daemon(Some(d)),
                Err(e @ LaunchError::Failed { .. })
                    if e.to_string().contains("RLIMIT_MEMLOCK") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// One disk on `image` with `engine` and extra disk keys (`,readonly=on`...).
    pub fn one_disk(dir: &Path, image: &Path, engine: &str, extra: &str) -> Daemon {
        let socket = dir.join("vhost.sock");
        let args = vec![
            "--disk".to_string(),
            format!(
                "socket={},image={}{extra}",
                socket.display(),
                image.display()
            ),
            "--engine".to_string(),
            engine.to_string(),
        ];
        Daemon::start(&args, vec![socket])
    }

    fn inner(&self) -> &aio_test_support::launch::Daemon {
        self.0.as_ref().expect("running")
    }

    pub fn socket(&self) -> &Path {
        self.inner().socket(0)
    }

    /// What the daemon has printed so far.
    pub fn log(&mut self) -> String {
        self.0.as_mut().expect("running").log()
    }

    pub fn pid(&self) -> u32 {
        self.inner().pid()
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(self) -> std::process::ExitStatus {
        self.stop_with(nix::sys::signal::Signal::SIGTERM)
    }

    /// `signal`, then the exit status (SIGKILL after 5 s fails the test).
    pub fn stop_with(mut self, signal: nix::sys::signal::Signal) -> std::process::ExitStatus {
        let d = self.0.take().expect("running");
        eprint!("{}", d.log());
        d.stop_with(signal).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut d) = self.0.take() {
            d.kill();
            eprint!("{}", d.log());
        }
    }
}

/// The daemon binary run with `args`, which must end by itself within `limit` (a daemon that
/// was not refused serves until killed: the test fails then, it does not hang): exit code
/// and standard error.
pub fn daemon_refused(args: &[String], limit: Duration) -> (i32, String) {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = ended_within(child, limit);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub use aio_test_support::child::ended_within;

/// A client of `socket` with `queues` queues and a region of `region_bytes`.
pub fn connect(socket: &Path, queues: usize, region_bytes: usize) -> Result<Client, ClientError> {
    Client::connect(&ClientConfig {
        queues,
        region_bytes,
        ..ClientConfig::new(socket)
    })
}

/// As `connect`, read-only (libblkio refuses to start a writable client of a read-only
/// device).
pub fn connect_read_only(socket: &Path, region_bytes: usize) -> Result<Client, ClientError> {
    Client::connect(&ClientConfig {
        region_bytes,
        read_only: true,
        ..ClientConfig::new(socket)
    })
}

/// An image file of `bytes` in a fresh temporary directory (in /dev/shm when it exists, so
/// O_DIRECT works without a disk).
pub fn image(bytes: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = aio_test_support::images::memory_dir("vub");
    let path = aio_test_support::images::raw_image(dir.path(), "disk.img", bytes, 0, 0);
    (dir, path)
}

/// The engines this kernel offers, by the daemon's names; each one refused says `skipped:`
/// why (a failure under `AIO_REQUIRE_ALL_BACKENDS=1`).
pub fn engines() -> Vec<&'static str> {
    aio_test_support::engines::engine_kinds()
        .into_iter()
        .map(|k| k.name())
        .collect()
}

pub use aio_test_support::tool::installed as runnable;

/// Runs `qemu-img` with `args`; panics with its output if it fails, else returns its output.
pub fn qemu_img(args: &[&str]) -> String {
    aio_test_support::tool::run("qemu-img", args)
}

/// The PID a `--daemonize`d daemon wrote to `pidfile`, checked to run in `/` (it keeps no
/// directory busy, as qemu-storage-daemon).
pub fn daemonized_pid(pidfile: &Path) -> i32 {
    let pid: i32 = std::fs::read_to_string(pidfile)
        .expect("the pid file")
        .trim()
        .parse()
        .expect("a pid");
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
    assert_eq!(cwd, Path::new("/"), "the daemon's directory");
    pid
}

/// Sends SIGTERM to the detached daemon `pid` and waits (at most 10 s) until it is gone.
pub fn terminate_daemonized(pid: i32) {
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nix::sys::signal::kill(pid, None).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon outlived SIGTERM by 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
