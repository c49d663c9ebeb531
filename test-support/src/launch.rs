//! A daemon started as a child process: its command line, its environment, its log, its CPU,
//! its sockets (the storage daemon's tests, qemu-storage-daemon beside it, the guest tests'
//! QEMU, `aio-bench vhost`).
//!
//! [`Launch::start`] spawns the program, waits (at most [`Launch::socket_wait`]) until every
//! socket it names exists, and reports a daemon that exits before with its exit status,
//! command line and the end of its log. [`Daemon::stop`] sends SIGTERM and waits (at most
//! [`Launch::stop_wait`], then SIGKILL), [`Daemon::stop_cleanly`] wants status 0 then; a
//! [`Daemon`] dropped without it is killed, so a failed test leaves nothing running. A stream
//! the test reads itself (QEMU's serial console) is a pipe ([`Launch::pipe_stdout`]) instead
//! of the log.
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

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

mod daemon;

use daemon::file_id;
pub use daemon::Daemon;

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
    envs: Vec<(OsString, OsString)>,
    sockets: Vec<PathBuf>,
    label: String,
    log: Option<PathBuf>,
    cpu: Option<usize>,
    socket_wait: Duration,
    stop_wait: Duration,
    /// The sockets are a running daemon's, which this one replaces (an upgrade).
    replacing: bool,
    /// stdin, stdout and stderr are pipes (else /dev/null, the log, the log).
    pipes: [bool; 3],
}

impl Launch {
    /// The longest wait for the sockets by default.
    pub const SOCKET_WAIT: Duration = Duration::from_secs(10);

    /// `program` with no arguments, the test's environment, no sockets, its log in an
    /// anonymous file, not pinned.
    pub fn new(program: impl Into<PathBuf>) -> Launch {
        let program = program.into();
        Launch {
            label: program.display().to_string(),
            program,
            args: Vec::new(),
            envs: Vec::new(),
            sockets: Vec::new(),
            log: None,
            cpu: None,
            socket_wait: Launch::SOCKET_WAIT,
            stop_wait: Daemon::STOP_WAIT,
            replacing: false,
            pipes: [false; 3],
        }
    }

    /// Adds one argument.
    pub fn arg(self, arg: impl Into<String>) -> Launch {
        self.args([arg])
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

    /// Sets the environment variable `key` to `value` in the daemon's environment.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Launch {
        self.envs.push((key.into(), value.into()));
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

    /// The longest wait for the exit after [`Daemon::stop`]'s signal (then the daemon is
    /// killed); [`Daemon::STOP_WAIT`] by default.
    pub fn stop_wait(mut self, wait: Duration) -> Launch {
        self.stop_wait = wait;
        self
    }

    /// Its stdin is a pipe, for [`Daemon::take_stdin`] (default: `/dev/null`).
    pub fn pipe_stdin(mut self) -> Launch {
        self.pipes[0] = true;
        self
    }

    /// Its stdout is a pipe, for [`Daemon::take_stdout`], instead of the log.
    pub fn pipe_stdout(mut self) -> Launch {
        self.pipes[1] = true;
        self
    }

    /// Its stderr is a pipe, for [`Daemon::take_stderr`], instead of the log.
    pub fn pipe_stderr(mut self) -> Launch {
        self.pipes[2] = true;
        self
    }

    /// The command line, as a shell would show it (the environment it sets first).
    pub fn command_line(&self) -> String {
        let mut line = String::new();
        for (key, value) in &self.envs {
            line.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
        line.push_str(&self.program.display().to_string());
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
        let to_log = |piped: bool| -> Result<Stdio, LaunchError> {
            if piped {
                return Ok(Stdio::piped());
            }
            let log = log.try_clone().map_err(io_err("creating its log".into()))?;
            Ok(log.into())
        };
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(if self.pipes[0] {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(to_log(self.pipes[1])?)
            .stderr(to_log(self.pipes[2])?);
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
            stop_wait: self.stop_wait,
            stopped: false,
        };
        let sockets: Vec<_> = self.sockets.iter().cloned().zip(earlier).collect();
        daemon.wait_for_sockets(&sockets, self.socket_wait)?;
        Ok(daemon)
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

    /// A child given an environment variable and pipes: what it reads on stdin and prints
    /// on stdout goes through the pipes, its stderr to the log; its exit is waited for.
    #[test]
    fn a_childs_environment_and_pipes() {
        use std::io::{Read, Write};
        let launch = Launch::new("/bin/sh")
            .args(["-c", "read line; echo \"$GREETING $line\"; echo said >&2"])
            .env("GREETING", "hello")
            .pipe_stdin()
            .pipe_stdout();
        assert!(launch
            .command_line()
            .starts_with("GREETING=hello /bin/sh -c"));
        let mut d = launch.start().unwrap();
        let mut stdin = d.take_stdin().expect("a pipe");
        stdin.write_all(b"world\n").unwrap();
        drop(stdin);
        let mut out = String::new();
        d.take_stdout().unwrap().read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello world\n");
        assert!(d.take_stderr().is_none());
        while !d.log().contains("said") {
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = d.wait_exit(Duration::from_secs(30)).expect("it exits");
        assert!(status.success(), "{status}");
    }

    /// A shell that answers SIGTERM with `on_term` (a `trap` action), once it says so.
    fn trapping(on_term: &str, stop_wait: Duration) -> Daemon {
        let script = format!("trap '{on_term}' TERM; echo ready; while :; do sleep 0.02; done");
        let d = Launch::new("/bin/sh")
            .args(["-c", &script])
            .stop_wait(stop_wait)
            .start()
            .unwrap();
        while !d.log().contains("ready") {
            std::thread::sleep(Duration::from_millis(5));
        }
        d
    }

    /// A socket made after the start is waited for, the child's exit ending the wait; SIGTERM
    /// answered by status 0 is a clean stop, with the log, any other end an error.
    #[test]
    fn a_socket_waited_for_and_a_clean_stop() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("late.sock");
        let mut d = trapping("exit 0", Daemon::STOP_WAIT);
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        d.wait_for_socket(&sock, Duration::from_secs(30)).unwrap();
        assert_eq!(d.try_wait().unwrap(), None);
        assert_eq!(d.stop_cleanly().unwrap(), "ready\n");

        let mut d = Launch::new("/bin/sh")
            .args(["-c", "echo bye; exit 5"])
            .start()
            .unwrap();
        let e = d
            .wait_for_socket(&dir.path().join("never.sock"), Duration::from_secs(30))
            .unwrap_err();
        assert!(
            e.to_string().contains("exited (exit status: 5) before"),
            "{e}"
        );
        assert!(e.to_string().contains("its output:\n  bye"), "{e}");

        let e = trapping("exit 4", Daemon::STOP_WAIT)
            .stop_cleanly()
            .unwrap_err();
        assert!(
            e.to_string().contains("(exit status: 4) after SIGTERM"),
            "{e}"
        );

        let e = trapping("", Duration::from_millis(100)).stop().unwrap_err();
        assert!(
            e.to_string().contains("within 100 ms of SIGTERM (killed)"),
            "{e}"
        );
    }
}
