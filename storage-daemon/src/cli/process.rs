//! What qemu-storage-daemon's `--daemonize` and `--pidfile` do to the process: detach once
//! serving, and say where the daemon's PID is.
//!
//! This module owns the fork, the readiness pipe and the PID file; the daemon itself knows
//! nothing of them (it calls a `ready` closure once every socket listens).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The detached child's end of the pipe its parent waits on.
#[derive(Debug)]
pub(crate) struct Detached {
    ready: File,
}

/// Forks before any thread starts. The parent waits until the child says it serves (exit 0)
/// or ends (its exit code; the child printed why on the shared standard error), and never
/// returns. The child starts a session of its own and returns its end of the pipe.
pub(crate) fn daemonize() -> io::Result<Detached> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is an array of two ints, as pipe2 asks.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process has one thread here (the caller forks before starting any), so
    // the child may run any code after fork.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(read_end);
            // SAFETY: no arguments; fails only if already a group leader, which a fresh
            // child is not.
            unsafe { libc::setsid() };
            Ok(Detached {
                ready: File::from(write_end),
            })
        }
        child => {
            drop(write_end);
            let mut word = [0u8; 1];
            let code = match File::from(read_end).read(&mut word) {
                Ok(1) => 0,
                _ => exit_code_of(child),
            };
            std::process::exit(code);
        }
    }
}

/// The exit code of `child`, once it ended.
fn exit_code_of(child: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: `status` is an int the call writes; `child` is our own child.
    let waited = unsafe { libc::waitpid(child, &mut status, 0) };
    if waited == child && libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        1
    }
}

impl Detached {
    /// Tells the waiting parent that the daemon serves, and points standard input, output and
    /// error at `/dev/null` (the terminal is the parent's), as QEMU does.
    pub(crate) fn serving(mut self) {
        let _ = self.ready.write_all(&[0]);
        if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
            for fd in 0..3 {
                // SAFETY: `null` is open; dup2 onto the standard descriptors replaces them.
                unsafe { libc::dup2(null.as_raw_fd(), fd) };
            }
        }
    }
}

/// A PID file: written and locked while the daemon runs, removed when dropped.
#[derive(Debug)]
pub(crate) struct PidFile {
    path: PathBuf,
    _file: File,
}

impl PidFile {
    /// Writes this process's PID into `path`, holding a lock on it: a second daemon given the
    /// same file is refused while the first runs, as QEMU's.
    pub(crate) fn create(path: &Path) -> io::Result<PidFile> {
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // SAFETY: `file` is open; flock takes no pointer.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("{}: locked by another daemon ({e})", path.display()),
            ));
        }
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(PidFile {
            path: path.to_path_buf(),
            _file: file,
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_holds_the_pid_is_locked_and_goes_away() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.pid");
        let pid = PidFile::create(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        let e = PidFile::create(&path).unwrap_err();
        assert!(e.to_string().contains("locked"), "{e}");
        drop(pid);
        assert!(!path.exists());
    }
}
