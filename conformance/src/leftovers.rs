//! What killed test processes left behind. A process ended by `SIGKILL` (a test harness's
//! timeout, a mutation-testing run that gave up on a mutant) runs no destructors, so the
//! fixtures' files, loop devices, mounts and cgroups stay; on a machine that runs the suites
//! many times they pile up until `losetup --find` has no free device left.
//!
//! Every such fixture is named `aio-rs-<kind>-<pid>-<n>` after the process that made it.
//! [`sweep`] removes those whose process is gone, once per process, before a fixture makes its
//! own. A name whose pid is alive (this process, a suite running beside it, or a new process
//! that reused the pid) is left alone: the sweep only ever errs on the side of keeping.
//!
//! This module owns the sweep, never a fixture: the fixtures live in `fixtures` (files, loop
//! devices), `disk` (mounts) and `throttle` (cgroups).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

/// The prefix of every fixture's name.
const PREFIX: &str = "aio-rs-";

/// Where cgroup v1's `blkio` controller keeps the write limits' cgroups.
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// Removes, once per process, what dead test processes left: mounts under the temp dir, loop
/// devices over temp files, the temp files, and `blkio` cgroups. Best effort: what cannot be
/// removed (not root, a device still busy) stays and is not an error.
pub fn sweep() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let tmp = std::env::temp_dir();
        unmount_dead(&tmp);
        detach_dead_loop_devices(&tmp);
        remove_dead_entries(&tmp);
        remove_dead_entries(Path::new(BLKIO));
    });
}

/// The pid in a fixture's name (`aio-rs-<kind>-<pid>-<n>`), if it is one.
fn owner(name: &OsStr) -> Option<i32> {
    let rest = name.to_str()?.strip_prefix(PREFIX)?;
    let mut parts = rest.split('-');
    let (_kind, pid, n) = (parts.next()?, parts.next()?, parts.next()?);
    n.parse::<u64>().ok()?;
    if parts.next().is_some() {
        return None;
    }
    pid.parse().ok()
}

/// Whether no process has this pid (and so nothing of its can still be in use).
fn gone(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only asks whether `pid` exists.
    pid > 0
        && unsafe { libc::kill(pid, 0) } == -1
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Whether `path` is a fixture of a dead process.
fn dead_fixture(path: &Path) -> bool {
    path.file_name().and_then(owner).is_some_and(gone)
}

/// Unmounts the file systems mounted on dead processes' directories in `tmp`, and removes
/// the directories.
fn unmount_dead(tmp: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let dead: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(1))
        .map(PathBuf::from)
        .filter(|dir| dir.parent() == Some(tmp) && dead_fixture(dir))
        .collect();
    for dir in dead {
        // A directory mounted more than once comes up once per mount.
        let _ = Command::new("umount").arg(&dir).status();
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Detaches the loop devices whose backing file is a dead process's temp file.
fn detach_dead_loop_devices(tmp: &Path) {
    let Ok(out) = Command::new("losetup")
        .args([
            "--list",
            "--noheadings",
            "--raw",
            "--output",
            "NAME,BACK-FILE",
        ])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((device, backing)) = line.split_once(' ') else {
            continue;
        };
        // A removed backing file is listed with " (deleted)" after its path.
        let backing = Path::new(backing.trim_end_matches(" (deleted)"));
        if backing.parent() == Some(tmp) && dead_fixture(backing) {
            let _ = Command::new("losetup").arg("-d").arg(device).status();
        }
    }
}

/// Removes dead processes' files and empty directories (cgroups included) directly in `dir`.
fn remove_dead_entries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !dead_fixture(&path) {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => {
                let _ = std::fs::remove_dir(&path);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Above the kernel's largest `pid_max` (2^22): no process can have it.
    const NEVER_A_PID: i32 = 1 << 23;

    #[test]
    fn a_fixture_name_gives_its_pid_and_nothing_else_does() {
        assert_eq!(owner(OsStr::new("aio-rs-test-123-4")), Some(123));
        assert_eq!(owner(OsStr::new("aio-rs-ramfs-77-0")), Some(77));
        assert_eq!(owner(OsStr::new("aio-rs-test-123")), None);
        assert_eq!(owner(OsStr::new("aio-rs-test-123-4-5")), None);
        assert_eq!(owner(OsStr::new("aio-rs-test-x-4")), None);
        assert_eq!(owner(OsStr::new("aio-bench-matrix-123")), None);
    }

    #[test]
    fn only_a_dead_process_counts_as_gone() {
        assert!(gone(NEVER_A_PID));
        assert!(!gone(std::process::id() as i32));
        assert!(
            !gone(0),
            "pid 0 would name the process group, not a process"
        );
    }

    #[test]
    fn a_dead_processs_files_go_and_a_live_ones_stay() {
        let dir = std::env::temp_dir().join(format!("leftovers-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dead_file = dir.join(format!("aio-rs-test-{NEVER_A_PID}-0"));
        let dead_dir = dir.join(format!("aio-rs-test-{NEVER_A_PID}-1"));
        let live_file = dir.join(format!("aio-rs-test-{}-0", std::process::id()));
        let other = dir.join(format!("unrelated-{NEVER_A_PID}-0"));
        for f in [&dead_file, &live_file, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        std::fs::create_dir(&dead_dir).unwrap();

        remove_dead_entries(&dir);

        assert!(
            !dead_file.exists() && !dead_dir.exists(),
            "the dead process's fixtures go"
        );
        assert!(live_file.exists(), "this process's file stays");
        assert!(other.exists(), "a name that is not a fixture's stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
