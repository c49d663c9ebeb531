//! What a wake-up costs on this machine: the time from waking a sleeping thread to its running,
//! which a loop that sleeps instead of polling pays on every event.
//!
//! This module owns the measurement, made once per process on first use: 32 wake-ups of a
//! parked helper thread, each after a 200 µs pause so that the helper (and, on a VM, its idle
//! vCPU) is asleep as a waiting loop would be; the median is the cost. About 10 ms, once.

use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Rounds of the measurement.
const ROUNDS: usize = 32;
/// What is assumed when no helper thread can be started (the middle of what VMs measure).
const FALLBACK_NS: u64 = 30_000;

/// The median wake-up cost of this machine in ns, measured on the first call.
pub(crate) fn wake_ns() -> u64 {
    static MEASURED: OnceLock<u64> = OnceLock::new();
    *MEASURED.get_or_init(|| measure().unwrap_or(FALLBACK_NS))
}

fn measure() -> Option<u64> {
    let (woken_tx, woken_rx) = mpsc::channel::<Instant>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let helper = std::thread::Builder::new()
        .name("aio-wake-probe".into())
        .spawn(move || {
            for _ in 0..ROUNDS {
                // Parked until the measuring thread unparks it (a spurious wake-up only
                // shortens that round, and the median drops it).
                if go_rx.recv().is_err() {
                    return;
                }
                std::thread::park();
                if woken_tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        go_tx.send(()).ok()?;
        std::thread::sleep(Duration::from_micros(200));
        let sent = Instant::now();
        helper.thread().unpark();
        let woke = woken_rx.recv().ok()?;
        samples.push(woke.saturating_duration_since(sent).as_nanos() as u64);
    }
    helper.join().ok()?;
    samples.sort_unstable();
    Some(samples[ROUNDS / 2].max(1))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wake_up_costs_something_and_is_measured_once() {
        let first = super::wake_ns();
        assert!(first > 0);
        // Below a second on any machine that runs this suite.
        assert!(first < 1_000_000_000, "{first} ns");
        assert_eq!(super::wake_ns(), first, "measured once per process");
    }
}
