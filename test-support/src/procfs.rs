//! What `/proc` says of a process, this one or a child: its open fds (how many, and what they
//! are, for the message when they leak), its resident memory, a field of its status.
//!
//! This module owns reading `/proc/PID/...`; what a count or a size must be is the test's. A
//! file that cannot be read fails the test, naming it.

use std::path::PathBuf;

/// A process whose `/proc` entries are read: this one ([`Proc::current`]) or another by its
/// PID ([`Proc::of`]).
#[derive(Debug, Clone)]
pub struct Proc {
    dir: PathBuf,
}

impl Proc {
    /// This process (`/proc/self`).
    pub fn current() -> Proc {
        Proc {
            dir: PathBuf::from("/proc/self"),
        }
    }

    /// Process `pid` (a daemon the test started).
    pub fn of(pid: u32) -> Proc {
        Proc {
            dir: PathBuf::from(format!("/proc/{pid}")),
        }
    }

    /// How many fds it has open.
    pub fn fd_count(&self) -> usize {
        self.fds().count()
    }

    /// What its open fds are (their `/proc/PID/fd` links: `"/dev/null"`, `"anon_inode:[eventfd]"`).
    pub fn fd_targets(&self) -> Vec<String> {
        self.fds()
            .map(|e| format!("{:?}", std::fs::read_link(e.path()).unwrap_or_default()))
            .collect()
    }

    /// The value of `field` in its `status` (`"CapEff"`: `"000001ffffffffff"`), trimmed;
    /// None if the kernel writes no such field.
    pub fn status(&self, field: &str) -> Option<String> {
        let path = self.dir.join("status");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    }

    /// Its resident memory in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let rss = self
            .status("VmRSS")
            .unwrap_or_else(|| panic!("no VmRSS in {}/status", self.dir.display()));
        rss.trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("VmRSS {rss:?}: {e}"))
    }

    fn fds(&self) -> impl Iterator<Item = std::fs::DirEntry> {
        let path = self.dir.join("fd");
        std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The other tests of this binary open and close fds beside this one: it looks for a
    /// file of its own, not at the counts.
    #[test]
    fn this_process_is_read_by_pid_as_by_self() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine");
        let named = |p: &Proc| p.fd_targets().iter().any(|t| t.contains("mine"));
        let (me, by_pid) = (Proc::current(), Proc::of(std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        assert!(named(&me) && named(&by_pid));
        assert!(me.fd_count() > 0 && by_pid.fd_count() > 0);
        drop(file);
        assert!(!named(&me));
        assert!(me.rss_kib() > 0);
        assert_eq!(me.status("Pid").unwrap(), std::process::id().to_string());
        assert!(me.status("CapEff").is_some());
        assert_eq!(me.status("NoSuchField"), None);
    }
}
