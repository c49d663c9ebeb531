//! The running daemon of a [`Launch`](super::Launch): its process, its log, its sockets, the
//! waits for its sockets and its exit, and the signals that end it.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, ExitStatus};
use std::time::{Duration, Instant};

use super::LaunchError;

/// Lines of a failed daemon's log quoted in its error.
const LOG_LINES: usize = 30;

/// A running daemon; dropped without [`stop`](Daemon::stop), it is killed.
#[derive(Debug)]
pub struct Daemon {
    pub(super) label: String,
    pub(super) command: String,
    pub(super) child: Child,
    pub(super) sockets: Vec<PathBuf>,
    pub(super) log: File,
    pub(super) stop_wait: Duration,
    pub(super) stopped: bool,
}

impl Daemon {
    /// The longest wait for an exit after SIGTERM by default (then SIGKILL); see
    /// [`Launch::stop_wait`](super::Launch::stop_wait).
    pub const STOP_WAIT: Duration = Duration::from_secs(5);

    /// Waits for every socket of `sockets` to exist, and for each one that names an earlier
    /// file (its device and inode) to be another file than that one.
    pub(super) fn wait_for_sockets(
        &mut self,
        sockets: &[(PathBuf, Option<(u64, u64)>)],
        wait: Duration,
    ) -> Result<(), LaunchError> {
        let deadline = Instant::now() + wait;
        loop {
            let missing = sockets
                .iter()
                .find(|(s, old)| !is_socket(s) || (old.is_some() && file_id(s) == *old))
                .map(|(s, _)| s);
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

    /// Waits (at most `wait`) until `path` is a socket, one the daemon makes after its start
    /// (QEMU's monitor, read once its console is); an error says how the daemon ended first,
    /// or that the wait ran out (it is then killed), with the end of its log.
    pub fn wait_for_socket(&mut self, path: &Path, wait: Duration) -> Result<(), LaunchError> {
        self.wait_for_sockets(&[(path.to_path_buf(), None)], wait)
    }

    /// Waits up to `timeout` for the daemon to exit by itself (no signal sent); its status,
    /// or None if it still runs (it is then killed, being dropped).
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

    /// How it exited (the process reaped), or None while it runs.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, LaunchError> {
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

    /// What the daemon printed so far (stdout and stderr, but a stream given a pipe by
    /// [`Launch::pipe_stdout`](super::Launch::pipe_stdout) or `pipe_stderr`).
    pub fn log(&self) -> String {
        let mut text = String::new();
        let mut log = &self.log;
        let _ = log.seek(io::SeekFrom::Start(0));
        let _ = log.read_to_string(&mut text);
        text
    }

    /// Its stdin, once, when [`Launch::pipe_stdin`](super::Launch::pipe_stdin) asked for a
    /// pipe.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Its stdout, once, when [`Launch::pipe_stdout`](super::Launch::pipe_stdout) asked for
    /// a pipe (read it: a full pipe stops the daemon).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Its stderr, once, when [`Launch::pipe_stderr`](super::Launch::pipe_stderr) asked for
    /// a pipe (read it: a full pipe stops the daemon).
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its name in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Socket `i`, in the order [`Launch::socket`](super::Launch::socket) gave them.
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

    /// Sends SIGTERM and waits for the exit (SIGKILL after [`Daemon::STOP_WAIT`], or the
    /// launch's [`stop_wait`](super::Launch::stop_wait)); returns how it exited.
    pub fn stop(self) -> Result<ExitStatus, LaunchError> {
        self.stop_with(nix::sys::signal::Signal::SIGTERM)
    }

    /// As [`stop`](Daemon::stop), with `signal` instead of SIGTERM (SIGINT, as Ctrl-C).
    pub fn stop_with(
        mut self,
        signal: nix::sys::signal::Signal,
    ) -> Result<ExitStatus, LaunchError> {
        self.signal_and_wait(signal)
    }

    /// As [`stop`](Daemon::stop), and the exit must be status 0 (a daemon's documented
    /// answer to SIGTERM): its whole log; an error says how else it ended, with the end of
    /// its log.
    pub fn stop_cleanly(mut self) -> Result<String, LaunchError> {
        let status = self.signal_and_wait(nix::sys::signal::Signal::SIGTERM)?;
        if status.success() {
            Ok(self.log())
        } else {
            Err(self.failure(format!("exited ({status}) after SIGTERM")))
        }
    }

    fn signal_and_wait(
        &mut self,
        signal: nix::sys::signal::Signal,
    ) -> Result<ExitStatus, LaunchError> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        let _ = self.signal(signal);
        let deadline = Instant::now() + self.stop_wait;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                let what = format!(
                    "did not exit within {} ms of {signal} (killed)",
                    self.stop_wait.as_millis()
                );
                return Err(self.failure(what));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills it (SIGKILL) and reaps it; how it ended (None: it could not be waited for).
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        self.stopped = true;
        self.child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.stopped {
            self.kill();
        }
    }
}

/// The device and inode of the file at `path`, if any.
pub(super) fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether `path` exists and is a socket.
fn is_socket(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}
