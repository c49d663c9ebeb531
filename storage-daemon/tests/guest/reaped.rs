//! A child process of the guest test (QEMU, a daemon) that is killed and reaped when dropped.

use std::fs::{self, File};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::harness::SOCKET_TIMEOUT;

/// A child process that is killed and reaped when dropped, so a failing test leaves nothing
/// running; its stdout and stderr go to a log file.
pub struct Reaped {
    /// The process, until it has been waited for.
    pub child: Option<Child>,
    /// What it is, for messages.
    pub name: String,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Reaped {
    /// Starts `cmd` with its output in `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Reaped {
        let out = File::create(&log).expect("create the log file");
        let err = out.try_clone().expect("dup the log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Reaped {
            child: Some(child),
            name: name.to_string(),
            log,
        }
    }

    /// Its output so far.
    pub fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `socket` exists and is a socket; panics when the process exits first or
    /// the socket takes longer than [`SOCKET_TIMEOUT`].
    pub fn wait_for_socket(&mut self, socket: &Path) {
        let started = Instant::now();
        loop {
            if fs::metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
                return;
            }
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                panic!(
                    "{} exited ({status}) before {} appeared; its output:\n{}",
                    self.name,
                    socket.display(),
                    self.output()
                );
            }
            if started.elapsed() > SOCKET_TIMEOUT {
                panic!(
                    "{} did not create {} within {SOCKET_TIMEOUT:?}; its output:\n{}",
                    self.name,
                    socket.display(),
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`terminate`](Self::terminate), and asserts the server exited with status 0 (a
    /// daemon's documented answer to SIGTERM); shows its output either way.
    pub fn terminate_cleanly(&mut self) {
        let status = self.terminate();
        let output = self.output();
        if !output.is_empty() {
            println!(
                "{} output:
{output}",
                self.name
            );
        }
        let name = &self.name;
        match status {
            Some(s) if s.success() => {}
            Some(s) => panic!(
                "{name} exited with {s} after SIGTERM; output:
{output}"
            ),
            None => panic!(
                "{name} did not exit within 10 s of SIGTERM; output:
{output}"
            ),
        }
    }

    /// Sends SIGTERM and waits up to 10 s for the exit; gives its status (`None`: it had to
    /// be killed).
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, which has not been reaped yet (so the pid is
        // still ours); it touches no memory.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
