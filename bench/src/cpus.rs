//! `--cpus`: a CPU list, and pinning the bench's threads to it as `taskset` would; and the CPU
//! time a thread or the process has used.
//!
//! This module owns the list's syntax, the placement rule, the affinity call and the
//! `getrusage` readings only.
//!
//! The placement rule (`aio-bench matrix --cpus LIST --iothreads K`), as one would place a
//! VMM's threads: the iothreads get dedicated CPUs, the guests (the vCPUs) the rest.
//!
//! * Iothread `t` is pinned to the one CPU `LIST[t % LIST.len()]` ([`iothread_cpu`]): the
//!   first K CPUs of the list, round-robin when the list is shorter. The threads its engine
//!   starts (the thread pool's workers, started on demand by the iothread) inherit that CPU,
//!   as QEMU's pool threads, started from their iothread, inherit its pinning; io_uring's
//!   kernel workers follow the cgroup's CPU set instead.
//! * The guest threads run on the CPUs of the list that no iothread has, or on the whole list
//!   when the iothreads take all of it ([`guest_cpus`]).
//!
//! With `--cpus 0,1`: K = 1 puts the iothread on CPU 0 and the guests on CPU 1; K = 2 puts the
//! iothreads on CPUs 0 and 1 and the guests on both. With `--cpus 0-63 --iothreads 8`: the
//! iothreads on CPUs 0 to 7, the guests on 8 to 63. Anything else the process runs (the
//! main thread) stays on the whole list.

use nix::sys::resource::{getrusage, UsageWho};

/// CPU time (user + system) the calling thread has used, in seconds
/// (`getrusage(RUSAGE_THREAD)`).
pub fn thread_cpu_seconds() -> f64 {
    cpu_seconds(UsageWho::RUSAGE_THREAD)
}

/// CPU time (user + system) every thread of the process has used, in seconds
/// (`getrusage(RUSAGE_SELF)`: the pool's workers and io_uring's kernel workers, which are
/// threads of the process, included).
pub fn process_cpu_seconds() -> f64 {
    cpu_seconds(UsageWho::RUSAGE_SELF)
}

/// `who`'s user + system CPU time, in seconds (0 if `getrusage` failed, which it cannot for
/// the calling thread or process).
fn cpu_seconds(who: UsageWho) -> f64 {
    let Ok(ru) = getrusage(who) else {
        return 0.0;
    };
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(ru.user_time()) + tv(ru.system_time())
}

/// CPU numbers given with `--cpus`: aio-core's list, shared with the daemon.
pub use aio::process::CpuList;

/// Pins the calling thread (and so every thread it starts later) to `cpus`
/// ([`aio::process::pin_current_thread`]), with the error as `--cpus`'s message.
pub fn pin_to(cpus: &[usize]) -> Result<(), String> {
    aio::process::pin_current_thread(cpus).map_err(|e| format!("--cpus: {e}"))
}

/// The CPU iothread `t` is pinned to under the placement rule: `cpus[t % cpus.len()]`, or
/// `None` (not pinned) when `cpus` is empty.
pub fn iothread_cpu(cpus: &[usize], t: usize) -> Option<usize> {
    (!cpus.is_empty()).then(|| cpus[t % cpus.len()])
}

/// The CPUs the guest threads run on with `iothreads` iothreads under the placement rule:
/// those of `cpus` no iothread is pinned to, or all of `cpus` if the iothreads take every one
/// (empty when `cpus` is: not pinned).
pub fn guest_cpus(cpus: &[usize], iothreads: usize) -> Vec<usize> {
    let taken: Vec<usize> = (0..iothreads.min(cpus.len()))
        .filter_map(|t| iothread_cpu(cpus, t))
        .collect();
    let left: Vec<usize> = cpus
        .iter()
        .copied()
        .filter(|c| !taken.contains(c))
        .collect();
    if left.is_empty() {
        cpus.to_vec()
    } else {
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_lists() {
        assert_eq!("0".parse::<CpuList>().unwrap().as_slice(), [0]);
        assert_eq!("0-1,4".parse::<CpuList>().unwrap().as_slice(), [0, 1, 4]);
        assert!("3-1"
            .parse::<CpuList>()
            .unwrap_err()
            .to_string()
            .contains("'3-1'"));
        assert!("x".parse::<CpuList>().is_err());
        assert!("99999".parse::<CpuList>().is_err());
    }

    #[test]
    fn iothreads_take_the_list_round_robin() {
        let on: Vec<_> = (0..3).map(|t| iothread_cpu(&[2, 5], t)).collect();
        assert_eq!(on, [Some(2), Some(5), Some(2)]);
        assert_eq!(iothread_cpu(&[], 0), None);
        // The guests get what the iothreads leave, or everything.
        assert_eq!(guest_cpus(&[0, 1], 1), [1]);
        assert_eq!(guest_cpus(&[0, 1], 2), [0, 1]);
        assert_eq!(guest_cpus(&[0, 1], 3), [0, 1]);
        assert_eq!(guest_cpus(&[0, 1, 2, 3], 2), [2, 3]);
        assert!(guest_cpus(&[], 2).is_empty());
    }
}
