//! Settings of the whole process or of one thread, not of one loop: what a program serving
//! many fds may want to change once at start, and where its threads run.
//!
//! This module owns nothing of a context: [`raise_fd_limit`] changes the process for all its
//! threads, [`pin_current_thread`] the calling thread (and the threads it starts later).

use std::fmt;
use std::io;
use std::str::FromStr;

/// Raises the process's soft limit of open fds (`RLIMIT_NOFILE`) to its hard limit, for every
/// thread of the process (hundreds of registered fds need more than the usual 1024), and
/// returns the new soft limit (0 when the limit cannot be read).
pub fn raise_fd_limit() -> u64 {
    crate::sys::raise_fd_limit()
}

/// A list of CPU numbers as command lines write them (`taskset`, fio's `cpus_allowed`, QEMU):
/// `0`, `0,2`, `0-3`, `0-1,4`; every number below `CPU_SETSIZE`.
///
/// ```
/// let cpus: aio_core::process::CpuList = "0-1,4".parse()?;
/// assert_eq!(cpus.as_slice(), [0, 1, 4]);
/// assert_eq!(cpus.nth_wrapping(4), Some(1)); // iothread 4 of three CPUs: the second
/// # Ok::<(), aio_core::process::BadCpuList>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuList(Vec<usize>);

/// A CPU list that does not parse: the part that does not, quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a CPU or a range of CPUs (examples: 0, 0,1, 0-3)")]
pub struct BadCpuList(pub String);

crate::backend::io_error_from!(BadCpuList, |_| io::ErrorKind::InvalidInput);

impl CpuList {
    /// A list of these CPUs (each below `CPU_SETSIZE`, or pinning to it fails).
    pub fn new(cpus: Vec<usize>) -> Self {
        CpuList(cpus)
    }

    /// The CPUs, in the order given.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }

    /// Whether the list is empty (not pinned).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPU thread number `n` runs on when threads take the list's CPUs in turn:
    /// `cpus[n % len]`, or `None` for an empty list.
    pub fn nth_wrapping(&self, n: usize) -> Option<usize> {
        (!self.0.is_empty()).then(|| self.0[n % self.0.len()])
    }
}

impl FromStr for CpuList {
    type Err = BadCpuList;

    fn from_str(s: &str) -> Result<CpuList, BadCpuList> {
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let bad = || BadCpuList(part.to_string());
            let (lo, hi): (usize, usize) = match part.split_once('-') {
                Some((a, b)) => (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                ),
                None => {
                    let n = part.trim().parse().map_err(|_| bad())?;
                    (n, n)
                }
            };
            if lo > hi || hi >= libc::CPU_SETSIZE as usize {
                return Err(bad());
            }
            cpus.extend(lo..=hi);
        }
        Ok(CpuList(cpus))
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// Pins the calling thread (and so every thread it starts later) to `cpus`; an error names
/// the CPUs (a CPU at or above `CPU_SETSIZE`, or one this machine does not have).
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {c} is out of range"),
            )
        })?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(
            e.kind(),
            format!("CPUs {cpus:?}: {e} (does this machine have them?)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_print_and_refuse_what_is_not_one() {
        let l: CpuList = "0-1,4".parse().unwrap();
        assert_eq!(l.as_slice(), [0, 1, 4]);
        assert_eq!(l.to_string(), "0,1,4");
        assert_eq!("0".parse::<CpuList>().unwrap().as_slice(), [0]);
        for bad in ["3-1", "x", "", "0,,1", "99999"] {
            let e = bad.parse::<CpuList>().unwrap_err();
            assert!(e.to_string().contains('\''), "{bad}: {e}");
        }
        assert_eq!(CpuList::default().nth_wrapping(3), None);
    }

    #[test]
    fn pinning_to_a_cpu_this_thread_may_use_keeps_it_there() {
        std::thread::spawn(|| {
            let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
            let first = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| allowed.is_set(c).unwrap_or(false))
                .unwrap();
            pin_current_thread(&[first]).unwrap();
            let now = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
            let set: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| now.is_set(c).unwrap_or(false))
                .collect();
            assert_eq!(set, [first]);
            let e = pin_current_thread(&[libc::CPU_SETSIZE as usize]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        })
        .join()
        .unwrap();
    }
}
