//! What a wake-up costs on this machine: the time from waking a thread that sleeps on a file
//! descriptor to its running, which a loop that sleeps instead of polling pays on every event,
//! and the CPU the sleeping thread spends on the sleep and the wake-up itself (the blocking
//! call, the switch away and back), which polling does not spend.
//!
//! This module owns the measurement, made once per process on first use: 32 wake-ups of a
//! helper thread blocked reading a socket, each after a 200 µs pause so that the helper (and,
//! on a VM, its idle vCPU) is asleep as a waiting loop would be; the median delay is the
//! latency, the helper's own CPU time over the rounds the CPU. About 10 ms, once. A helper that
//! cannot start or does not answer within a second leaves the fallback (30 µs of latency, the
//! middle of what VMs measure, and no CPU).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Rounds of the measurement.
const ROUNDS: usize = 32;
/// What is assumed when the measurement cannot be made.
const FALLBACK: WakeCost = WakeCost {
    latency_ns: 30_000,
    cpu_ns: 0,
};

/// What one wake-up of a sleeping thread costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WakeCost {
    /// From the event to the thread running again (median), in ns.
    pub(crate) latency_ns: u64,
    /// The sleeping thread's CPU time per sleep and wake-up, in ns.
    pub(crate) cpu_ns: u64,
}

impl WakeCost {
    /// What a wait the loop sleeps through costs beyond the event's own time, in ns of latency
    /// as [`PollRule::Auto`](super::PollRule::Auto) weighs it: the wake-up's latency, and the
    /// sleep's own CPU at the price polling pays for its CPU
    /// ([`CPU_PRICE`](super::auto::CPU_PRICE)).
    pub(crate) fn price_ns(self) -> u64 {
        self.latency_ns + (self.cpu_ns as f64 * super::auto::CPU_PRICE) as u64
    }
}

/// The wake-up cost of this machine, measured on the first call.
pub(crate) fn wake_cost() -> WakeCost {
    static MEASURED: OnceLock<WakeCost> = OnceLock::new();
    *MEASURED.get_or_init(|| measure(Duration::from_secs(1)).unwrap_or(FALLBACK))
}

/// The calling thread's CPU time so far.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Measures the wake-up; None if a round's wake-up took longer than `give_up` (the machine is
/// too busy to say: the caller takes a fallback) or the helper could not run.
fn measure(give_up: Duration) -> Option<WakeCost> {
    let (mut ours, mut theirs) = UnixStream::pair().ok()?;
    let (woken_tx, woken_rx) = mpsc::channel::<Instant>();
    let helper = std::thread::Builder::new()
        .name("aio-wake-probe".into())
        .spawn(move || {
            let mut byte = [0u8; 1];
            let start = thread_cpu();
            // Blocked in read(2) until the measuring thread writes: the wake-up measured.
            while theirs.read_exact(&mut byte).is_ok() {
                if woken_tx.send(Instant::now()).is_err() {
                    break;
                }
            }
            thread_cpu().saturating_sub(start)
        })
        .ok()?;
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        std::thread::sleep(Duration::from_micros(200));
        let sent = Instant::now();
        ours.write_all(&[1]).ok()?;
        let woke = woken_rx.recv_timeout(give_up).ok()?;
        samples.push(woke.saturating_duration_since(sent).as_nanos() as u64);
    }
    // Closing our end ends the helper's read.
    drop(ours);
    let cpu = helper.join().ok()?;
    samples.sort_unstable();
    Some(WakeCost {
        latency_ns: samples[ROUNDS / 2].max(1),
        cpu_ns: (cpu.as_nanos() / ROUNDS as u128) as u64,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// How long the tests let one round's wake-up take: only a helper that never answers
    /// takes this long, however loaded the machine.
    const PATIENT: Duration = Duration::from_secs(60);

    #[test]
    fn a_wake_up_costs_something_and_is_measured_once() {
        let first = super::wake_cost();
        assert!(first.latency_ns > 0);
        // Below a second on any machine that runs this suite.
        assert!(first.latency_ns < 1_000_000_000, "{first:?}");
        assert!(first.cpu_ns < 1_000_000_000, "{first:?}");
        assert_eq!(super::wake_cost(), first, "measured once per process");
    }

    #[test]
    fn the_sleeping_thread_spends_cpu_on_each_wake_up() {
        // Two syscalls and two context switches a round at the least: never nothing.
        let cost = super::measure(PATIENT).expect("the helper answers");
        assert!(cost.cpu_ns > 0, "{cost:?}");
    }

    #[test]
    fn the_measurement_ends_every_time() {
        // The helper is blocked in a read, not parked: nothing else can take its wake-up.
        for _ in 0..20 {
            assert!(super::measure(PATIENT).is_some());
        }
    }
}
