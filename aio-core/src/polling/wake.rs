//! What a wake-up costs on this machine: the time from waking a thread that sleeps on a file
//! descriptor to its running, which a loop that sleeps instead of polling pays on every event.
//!
//! This module owns the measurement, made once per process on first use: 32 wake-ups of a
//! helper thread blocked reading a socket, each after a 200 µs pause so that the helper (and,
//! on a VM, its idle vCPU) is asleep as a waiting loop would be; the median is the cost. About
//! 10 ms, once. A helper that cannot start or does not answer within a second leaves the
//! fallback (30 µs, the middle of what VMs measure).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Rounds of the measurement.
const ROUNDS: usize = 32;
/// What is assumed when the measurement cannot be made.
const FALLBACK_NS: u64 = 30_000;

/// The median wake-up cost of this machine in ns, measured on the first call.
pub(crate) fn wake_ns() -> u64 {
    static MEASURED: OnceLock<u64> = OnceLock::new();
    *MEASURED.get_or_init(|| measure().unwrap_or(FALLBACK_NS))
}

fn measure() -> Option<u64> {
    let (mut ours, mut theirs) = UnixStream::pair().ok()?;
    let (woken_tx, woken_rx) = mpsc::channel::<Instant>();
    let helper = std::thread::Builder::new()
        .name("aio-wake-probe".into())
        .spawn(move || {
            let mut byte = [0u8; 1];
            // Blocked in read(2) until the measuring thread writes: the wake-up measured.
            while theirs.read_exact(&mut byte).is_ok() {
                if woken_tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        std::thread::sleep(Duration::from_micros(200));
        let sent = Instant::now();
        ours.write_all(&[1]).ok()?;
        let woke = woken_rx.recv_timeout(Duration::from_secs(1)).ok()?;
        samples.push(woke.saturating_duration_since(sent).as_nanos() as u64);
    }
    // Closing our end ends the helper's read.
    drop(ours);
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

    #[test]
    fn the_measurement_ends_every_time() {
        // The helper is blocked in a read, not parked: nothing else can take its wake-up.
        for _ in 0..20 {
            assert!(super::measure().is_some());
        }
    }
}
