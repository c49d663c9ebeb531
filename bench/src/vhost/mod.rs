//! `aio-bench vhost`: a vhost-user-blk client on libblkio, and our daemon beside
//! qemu-storage-daemon.
//!
//! The client ([`client`], a thread per queue in [`queue`]) drives one vhost-user-blk socket
//! through libblkio's `virtio-blk-vhost-user` driver, as a guest's virtio-blk driver would: per
//! virtqueue one thread keeps `iodepth` requests in flight in a memory region shared with the
//! daemon, and waits for completions on the queue's completion fd (`poll(2)`, then a
//! non-blocking `do_io`: QEMU's `block/blkio.c` interrupt mode, never busy polling). It reports
//! IOPS, MB/s, latency (mean, p50, p99) and the daemon's CPU time per request, read from
//! `/proc/PID/stat` ([`ProcCpu`]) around the measured window.
//!
//! [`daemons`] starts and stops the two daemons on the same image (qemu-storage-daemon with
//! one IOThread and a vhost-user-blk export per disk, and ours, the `aio-bench` binary
//! re-executed as `aio-bench vhost-daemon`), pinned to one CPU, each killed when the bench
//! is interrupted. [`compare`] runs them one at a time, alternating, round after round, and
//! prints the medians and the ratios ours/QEMU (and, with several disk counts, each count
//! against one disk).
//!
//! This module owns the vhost-user side of the bench only; the command line is
//! `cmd::vhost` in the binary.

pub mod client;
pub mod compare;
pub mod daemons;
pub mod queue;

use std::io;
use std::time::Duration;

pub use client::{run_client, ClientResult, ClientSpec};

/// A process's CPU time (user + system, all its threads) as `/proc/PID/stat` reports it:
/// fields 14 (`utime`) and 15 (`stime`), in clock ticks (`sysconf(_SC_CLK_TCK)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcCpu {
    /// The process.
    pub pid: u32,
}

impl ProcCpu {
    /// The process's CPU time so far; an error if it is gone or its stat cannot be read.
    pub fn read(&self) -> io::Result<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        let ticks = parse_stat_ticks(&stat).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("/proc/{}/stat: no utime and stime fields", self.pid),
            )
        })?;
        let per_second = clock_ticks_per_second();
        Ok(Duration::from_nanos(
            (u128::from(ticks) * 1_000_000_000 / u128::from(per_second)) as u64,
        ))
    }
}

/// `utime + stime` (fields 14 and 15, clock ticks) of a `/proc/PID/stat` line. The command
/// name (field 2) is in parentheses and may hold spaces and parentheses itself, so the fields
/// are counted from the last `)`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name: utime is field 14, index 11 here.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc/PID/stat`'s times (100 where it cannot be read,
/// the value on every Linux architecture).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads the configuration value it is asked for.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_fields_14_and_15_counted_after_the_name() {
        let line = "4242 (qemu (x) d) S 1 4242 4242 0 -1 4194560 1595 0 0 0 37 12 0 0 20 0 3 0";
        assert_eq!(parse_stat_ticks(line), Some(49));
        assert_eq!(parse_stat_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_stat_ticks("garbage"), None);
        let me = ProcCpu {
            pid: std::process::id(),
        };
        let a = me.read().unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(me.read().unwrap() >= a);
        assert!(ProcCpu { pid: u32::MAX }.read().is_err());
    }
}
