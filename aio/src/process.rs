//! Settings of the whole process or of one thread, not of one loop: what a program serving
//! many fds may want to change once at start, and where its threads run.
//!
//! This module owns nothing of a context: [`raise_fd_limit`] changes the process for all its
//! threads, [`pin_current_thread`] the calling thread (and the threads it starts later), and
//! [`cpu_time`] reads what a process has used.

use std::fmt;
use std::io;
use std::str::FromStr;

/// Raises the process's soft limit of open fds (`RLIMIT_NOFILE`) to its hard limit, for every
/// thread of the process (hundreds of registered fds need more than the usual 1024), and
/// returns the new soft limit (0 when the limit cannot be read).
pub fn raise_fd_limit() -> u64 {
    aio_core::kit::raise_fd_limit()
}

/// A list of CPU numbers as command lines write them (`taskset`, fio's `cpus_allowed`, QEMU):
/// `0`, `0,2`, `0-3`, `0-1,4`; every number below `CPU_SETSIZE`.
///
/// ```
/// let cpus: aio::process::CpuList = "0-1,4".parse()?;
/// assert_eq!(cpus.as_slice(), [0, 1, 4]);
/// assert_eq!(cpus.nth_wrapping(4), Some(1)); // iothread 4 of three CPUs: the second
/// # Ok::<(), aio::process::BadCpuList>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuList(Vec<usize>);

/// A CPU list that does not parse: the part that does not, quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a CPU or a range of CPUs (examples: 0, 0,1, 0-3)")]
pub struct BadCpuList(pub String);

aio_core::kit::io_error_from!(BadCpuList, |_| io::ErrorKind::InvalidInput);

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

/// A process's CPU time so far (user + system, all its threads), as `/proc/PID/stat` reports
/// it: fields 14 (`utime`) and 15 (`stime`), in clock ticks (`sysconf(_SC_CLK_TCK)`). An error
/// if the process is gone or its stat cannot be read.
pub fn cpu_time(pid: u32) -> io::Result<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = stat_ticks(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: no utime and stime fields"),
        )
    })?;
    // SAFETY: sysconf only reads the configuration value it is asked for.
    let per_second = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as u128,
        _ => 100, // the value on every Linux architecture
    };
    let nanos = u128::from(ticks) * 1_000_000_000 / per_second;
    Ok(std::time::Duration::from_nanos(nanos as u64))
}

/// `utime + stime` of a `/proc/PID/stat` line. The command name (field 2) is in parentheses
/// and may hold spaces and parentheses itself, so the fields are counted from the last `)`.
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name: utime is field 14, index 11 here.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_fields_14_and_15_counted_after_the_name() {
        let line = "4242 (qemu (x) d) S 1 4242 4242 0 -1 4194560 1595 0 0 0 37 12 0 0 20 0 3 0";
        assert_eq!(stat_ticks(line), Some(49));
        assert_eq!(stat_ticks("1 (x) S 1 2"), None);
        assert_eq!(stat_ticks("garbage"), None);
        let me = std::process::id();
        let before = cpu_time(me).unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time(me).unwrap() >= before);
        assert!(cpu_time(u32::MAX).is_err());
    }

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
