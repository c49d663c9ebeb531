//! A daemon started as a child process: its command line, its log, its CPU, its sockets (the
//! storage daemon's tests, qemu-storage-daemon beside it, `aio-bench vhost`).
//!
//! [`Launch::start`] spawns the program, waits (at most [`Launch::socket_wait`]) until every
//! socket it names exists, and reports a daemon that exits before with its exit status,
//! command line and the end of its log. [`Daemon::stop`] sends SIGTERM and waits (at most
//! [`Daemon::STOP_WAIT`], then SIGKILL); a [`Daemon`] dropped without it is killed.
//!
//! This module owns the child process, never the sockets' files beyond removing stale ones
//! before the start, and never what the daemon serves on them (protocol clients stay with
//! their crates).
//!
//! ```no_run
//! use aio_test_support::launch::Launch;
//!
//! let daemon = Launch::new("qemu-storage-daemon")
//!     .args(["--chardev", "socket,id=m,path=/tmp/qmp.sock,server=on,wait=off"])
//!     .args(["--monitor", "chardev=m"])
//!     .socket("/tmp/qmp.sock")
//!     .start()?;
//! println!("PID {}", daemon.pid());
//! daemon.stop()?;
//! # Ok::<(), aio_test_support::launch::LaunchError>(())
//! ```

use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Lines of a failed daemon's log quoted in its error.
const LOG_LINES: usize = 30;

/// Why a daemon could not be started, or how it ended early.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The program is not installed (not found on `PATH`).
    #[error("{label}: {program} is not installed")]
    NotInstalled {
        /// The daemon's name in messages.
        label: String,
        /// The program.
        program: String,
    },
    /// Spawning or waiting for the process failed.
    #[error("{label}: {what}: {source}")]
    Io {
        /// The daemon's name in messages.
        label: String,
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The CPU to pin to is not one the process can name.
    #[error("{label}: CPU {cpu} is out of range")]
    BadCpu {
        /// The daemon's name in messages.
        label: String,
        /// The CPU.
        cpu: usize,
    },
    /// The daemon exited, or never created its sockets: what happened, its command line and
    /// the end of what it printed.
    #[error("{label} {what}\n  command: {command}\n  {said}")]
    Failed {
        /// The daemon's name in messages.
        label: String,
        /// What happened (`exited (exit status: 2) before its socket S appeared`).
        what: String,
        /// Its command line.
        command: String,
        /// The last lines of its log, or "it printed nothing".
        said: String,
    },
}

impl From<LaunchError> for io::Error {
    fn from(e: LaunchError) -> io::Error {
        let kind = match &e {
            LaunchError::NotInstalled { .. } => io::ErrorKind::NotFound,
            LaunchError::BadCpu { .. } => io::ErrorKind::InvalidInput,
            LaunchError::Io { source, .. } => source.kind(),
            LaunchError::Failed { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// How to start a daemon: a builder for [`Daemon`].
#[derive(Debug, Clone)]
pub struct Launch {
    program: PathBuf,
    args: Vec<String>,
    sockets: Vec<PathBuf>,
    label: String,
    log: Option<PathBuf>,
    cpu: Option<usize>,
    socket_wait: Duration,
    /// The sockets are a running daemon's, which this one replaces (an upgrade).
    replacing: bool,
}

impl Launch {
    /// The longest wait for the sockets by default.
    pub const SOCKET_WAIT: Duration = Duration::from_secs(10);

    /// `program` with no arguments, no sockets, its log in an anonymous file, not pinned.
    pub fn new(program: impl Into<PathBuf>) -> Launch {
        let program = program.into();
        Launch {
            label: program.display().to_string(),
            program,
            args: Vec::new(),
            sockets: Vec::new(),
            log: None,
            cpu: None,
            socket_wait: Launch::SOCKET_WAIT,
            replacing: false,
        }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Launch
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// A socket the daemon creates when it is ready (a stale file there is removed first).
    pub fn socket(mut self, path: impl Into<PathBuf>) -> Launch {
        self.sockets.push(path.into());
        self
    }

    /// The daemon's name in messages (default: the program).
    pub fn label(mut self, label: impl Into<String>) -> Launch {
        self.label = label.into();
        self
    }

    /// Its stdout and stderr go to this file (default: an anonymous temporary file).
    pub fn log_to(mut self, path: impl Into<PathBuf>) -> Launch {
        self.log = Some(path.into());
        self
    }

    /// Pins the daemon, and every thread it starts, to `cpu` (as `taskset` would).
    pub fn pin_to(mut self, cpu: Option<usize>) -> Launch {
        self.cpu = cpu;
        self
    }

    /// An upgrade: the sockets' paths are a running daemon's, which this one takes over; they
    /// are left in place, and the daemon is ready once each path is a socket of its own.
    pub fn replacing(mut self) -> Launch {
        self.replacing = true;
        self
    }

    /// The longest wait for the sockets (then the daemon is killed).
    pub fn socket_wait(mut self, wait: Duration) -> Launch {
        self.socket_wait = wait;
        self
    }

    /// The command line, as a shell would show it.
    pub fn command_line(&self) -> String {
        let mut line = self.program.display().to_string();
        for a in &self.args {
            line.push(' ');
            line.push_str(a);
        }
        line
    }

    /// Starts the daemon and waits until its sockets exist.
    ///
    /// The child asks the kernel for SIGKILL when the thread that started it dies
    /// (`PR_SET_PDEATHSIG`), so no daemon outlives its test or bench; start and stop a daemon
    /// from one long-lived thread.
    pub fn start(&self) -> Result<Daemon, LaunchError> {
        let io_err = |what: String| {
            let label = self.label.clone();
            move |source| LaunchError::Io {
                label,
                what,
                source,
            }
        };
        // An earlier daemon's socket file would look like this one's: removed, or for an
        // upgrade remembered, so that the wait is for a file of another inode.
        let earlier: Vec<Option<(u64, u64)>> = self
            .sockets
            .iter()
            .map(|s| {
                if self.replacing {
                    file_id(s)
                } else {
                    let _ = std::fs::remove_file(s);
                    None
                }
            })
            .collect();
        let log = match &self.log {
            Some(path) => File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path),
            None => tempfile::tempfile(),
        }
        .map_err(io_err("creating its log".into()))?;
        let log_err = log.try_clone().map_err(io_err("creating its log".into()))?;
        let log_out = log.try_clone().map_err(io_err("creating its log".into()))?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(log_out)
            .stderr(log_err);
        let affinity = match self.cpu {
            Some(cpu) => {
                let mut set = nix::sched::CpuSet::new();
                set.set(cpu).map_err(|_| LaunchError::BadCpu {
                    label: self.label.clone(),
                    cpu,
                })?;
                Some(set)
            }
            None => None,
        };
        // SAFETY: the closure runs in the forked child before exec; it makes two system calls
        // (sched_setaffinity and prctl), both async-signal-safe, allocates nothing, takes no
        // lock, and reads a CPU set built before the fork.
        unsafe {
            cmd.pre_exec(move || in_child(affinity.as_ref()));
        }
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                LaunchError::NotInstalled {
                    label: self.label.clone(),
                    program: self.program.display().to_string(),
                }
            } else {
                io_err(format!("starting {}", self.command_line()))(e)
            }
        })?;
        let mut daemon = Daemon {
            label: self.label.clone(),
            command: self.command_line(),
            child,
            sockets: self.sockets.clone(),
            log,
            stopped: false,
        };
        daemon.wait_for_sockets(self.socket_wait, &earlier)?;
        Ok(daemon)
    }
}

/// A running daemon; dropped without [`stop`](Daemon::stop), it is killed.
#[derive(Debug)]
pub struct Daemon {
    label: String,
    command: String,
    child: Child,
    sockets: Vec<PathBuf>,
    log: File,
    stopped: bool,
}

impl Daemon {
    /// The longest wait for an exit after SIGTERM (then SIGKILL).
    pub const STOP_WAIT: Duration = Duration::from_secs(5);

    /// Waits for every socket to exist, and for each one that `earlier` names to be another
    /// file than that one.
    fn wait_for_sockets(
        &mut self,
        wait: Duration,
        earlier: &[Option<(u64, u64)>],
    ) -> Result<(), LaunchError> {
        let deadline = Instant::now() + wait;
        loop {
            let missing = self
                .sockets
                .iter()
                .zip(earlier)
                .find(|(s, old)| !is_socket(s) || (old.is_some() && file_id(s) == **old))
                .map(|(s, _)| s.clone());
            let Some(missing) = missing else {
                return Ok(());
            };
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(format!(
                    "exited ({status}) before its socket {} appeared",
                    missing.display()
                )));
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(self.failure(format!(
                    "did not create its socket {} within {} ms (killed)",
                    missing.display(),
                    wait.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `timeout` for the daemon to exit by itself (no signal sent); its status,
    /// or None if it still runs (it is then killed when dropped).
    pub fn wait_exit(mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>, LaunchError> {
        let status = self.child.try_wait().map_err(|source| LaunchError::Io {
            label: self.label.clone(),
            what: "waiting for it".into(),
            source,
        })?;
        self.stopped |= status.is_some();
        Ok(status)
    }

    fn failure(&mut self, what: String) -> LaunchError {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_LINES)..].join("\n  ");
        let said = if tail.trim().is_empty() {
            "it printed nothing".to_string()
        } else {
            format!("its output:\n  {tail}")
        };
        LaunchError::Failed {
            label: self.label.clone(),
            what,
            command: self.command.clone(),
            said,
        }
    }

    /// What the daemon printed so far (stdout and stderr).
    pub fn log(&mut self) -> String {
        let mut text = String::new();
        let _ = self.log.seek(io::SeekFrom::Start(0));
        let _ = self.log.read_to_string(&mut text);
        text
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its name in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Socket `i`, in the order [`Launch::socket`] gave them.
    pub fn socket(&self, i: usize) -> &Path {
        &self.sockets[i]
    }

    /// Whether it still runs; an error says how it ended, with its log.
    pub fn check_running(&mut self) -> Result<(), LaunchError> {
        match self.try_wait()? {
            None => Ok(()),
            Some(status) => Err(self.failure(format!("exited ({status}) during the run"))),
        }
    }

    /// Sends `signal` (SIGKILL to kill it as a crash would; the daemon is not waited for).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> io::Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).map_err(io::Error::from)
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after [`Daemon::STOP_WAIT`]); returns how
    /// it exited.
    pub fn stop(self) -> Result<ExitStatus, LaunchError> {
        self.stop_with(nix::sys::signal::Signal::SIGTERM)
    }

    /// As [`stop`](Daemon::stop), with `signal` instead of SIGTERM (SIGINT, as Ctrl-C).
    pub fn stop_with(
        mut self,
        signal: nix::sys::signal::Signal,
    ) -> Result<ExitStatus, LaunchError> {
        let _ = self.signal(signal);
        let deadline = Instant::now() + Daemon::STOP_WAIT;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                let what = format!(
                    "did not exit within {} s of {signal} (killed)",
                    Daemon::STOP_WAIT.as_secs()
                );
                return Err(self.failure(what));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stopped = true;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.stopped {
            self.kill();
        }
    }
}

/// In the forked child, before exec: the CPU affinity (inherited by every thread the daemon
/// starts), and SIGKILL when the thread that started it dies.
fn in_child(affinity: Option<&nix::sched::CpuSet>) -> io::Result<()> {
    if let Some(set) = affinity {
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set)?;
    }
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The device and inode of the file at `path`, if any.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether `path` exists and is a socket.
fn is_socket(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon that exits before its socket appears is reported with its status and what it
    /// printed; one that never makes it is killed after the wait; a missing program is named.
    #[test]
    fn a_daemon_that_fails_to_start_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let e = Launch::new("/bin/sh")
            .args(["-c", "echo no disk >&2; exit 3"])
            .socket(&sock)
            .start()
            .unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("exited (exit status: 3) before its socket"),
            "{t}"
        );
        assert!(t.contains("its output:\n  no disk"), "{t}");
        assert!(t.contains("command: /bin/sh -c"), "{t}");

        let e = Launch::new("/bin/sh")
            .args(["-c", "sleep 60"])
            .socket(&sock)
            .socket_wait(Duration::from_millis(50))
            .start()
            .unwrap_err();
        assert!(e.to_string().contains("within 50 ms (killed)"), "{e}");
        assert!(e.to_string().contains("it printed nothing"), "{e}");

        let e = Launch::new("/nonexistent/daemon").start().unwrap_err();
        assert!(matches!(e, LaunchError::NotInstalled { .. }), "{e:?}");
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::NotFound);
    }
}
