//! How a cell scales with iothreads, against what the CPUs allow (`--iothreads 1,K`).
//!
//! The ceiling: at one iothread the iothread is the bottleneck (it runs on a CPU of its own,
//! the guests on the others), so a cell does `1 / i` requests per second of that CPU, `i` and
//! `g` being the iothread's and the guests' CPU time per request. With K iothreads on C CPUs
//! that the guests share, every request costs `i + g` of the C CPUs, so K iothreads can do at
//! most `min(K, C / (1 + g / i))` times the one iothread's rate, with `g / i` measured at one
//! iothread. On two CPUs (`--cpus 0,1 --iothreads 1,2`) that is `2 / (1 + g / i)`: the
//! guests' CPU comes out of the second iothread's. The bound holds while the cost per request
//! stays what it was at one iothread; the report shows the one iothread's share of its CPU,
//! since the bound assumes it is near 100%.
//!
//! Where the engine does its I/O on other threads (the pool's workers, io_uring's kernel
//! workers on tmpfs) the iothread is not that busy and `i` leaves their CPU out. The second
//! ceiling counts every thread of the process: at one iothread the cell used `U` CPUs (its
//! process CPU time over the run), so on C CPUs K iothreads reach at most `min(K, C / U)`
//! times its rate. For an engine that does everything on the iothread the two agree.
//!
//! This module owns the scaling rows and the ceiling; it runs nothing.

use std::fmt::Write as _;

use super::cell::Cell;
use super::spec::MatrixSpec;

/// A cell at K iothreads against the same cell at one (in the JSON report under these names,
/// but `cell` for the label and `one_iothread_busy` for the iothread's busy share, with the
/// two `of_ceiling` quotients beside them).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Scaling {
    /// The cell at K iothreads.
    #[serde(rename = "cell")]
    pub label: String,
    /// K.
    pub iothreads: usize,
    /// MB/s at K over MB/s at one (the medians of the rounds).
    pub speedup: f64,
    /// The lowest and highest of the rounds' own ratios (each round's K run over its one).
    pub round_speedups: (f64, f64),
    /// The guests' CPU time per request over the iothread's, at one iothread.
    pub guest_over_iothread: f64,
    /// The one iothread's CPU time over the cell's ramp and measured time.
    #[serde(rename = "one_iothread_busy")]
    pub iothread_busy: f64,
    /// `min(K, C / (1 + g / i))`.
    pub ceiling: f64,
    /// The CPUs every thread of the process used at one iothread (its CPU time over the run).
    pub one_cpus: f64,
    /// `min(K, C / one_cpus)`: the ceiling with every thread's CPU counted.
    pub ceiling_all_threads: f64,
}

impl Scaling {
    /// The speedup over the ceiling (1: all the CPUs allow).
    pub fn of_ceiling(&self) -> f64 {
        self.speedup / self.ceiling
    }

    /// The speedup over the all-threads ceiling.
    pub fn of_ceiling_all_threads(&self) -> f64 {
        self.speedup / self.ceiling_all_threads
    }
}

/// `min(k, cpus / (1 + guest_over_iothread))`: how many times one iothread's rate K iothreads
/// can reach on `cpus` CPUs shared with guests that cost `guest_over_iothread` of an
/// iothread's CPU time per request.
pub fn ceiling(k: usize, cpus: usize, guest_over_iothread: f64) -> f64 {
    // The one iothread's own CPU plus the guests' share of one.
    bound(k, cpus, 1.0 + guest_over_iothread.max(0.0))
}

/// `min(k, cpus / used)`: K iothreads over one, on `cpus` CPUs, where one iothread's cell keeps
/// `used` CPUs busy and each request costs what it did there.
fn bound(k: usize, cpus: usize, used: f64) -> f64 {
    (k as f64).min(cpus as f64 / used)
}

/// The CPUs the cells ran on: `--cpus`, or every CPU this process may use.
fn cpus(spec: &MatrixSpec) -> usize {
    if spec.cpus.is_empty() {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        spec.cpus.len()
    }
}

/// A row for every cell at more than one iothread whose one-iothread cell was measured too
/// (none without `1` among `--iothreads`).
pub fn scaling(spec: &MatrixSpec, cells: &[Cell]) -> Vec<Scaling> {
    let cpus = cpus(spec);
    let span = (spec.cell.ramp + spec.cell.runtime).as_secs_f64();
    let mut rows = Vec::new();
    if span <= 0.0 {
        return rows;
    }
    for c in cells.iter().filter(|c| c.iothreads > 1) {
        let Some(one) = cells.iter().find(|o| {
            o.iothreads == 1
                && (o.engine, o.fdmon, o.disks, o.workload, o.queues)
                    == (c.engine, c.fdmon, c.disks, c.workload, c.queues)
        }) else {
            continue;
        };
        let (g, i) = (one.result.guest_cpu_s, one.result.iothread_cpu_s);
        let one_cpus = one.result.process_cpu_s / span;
        if i <= 0.0 || one_cpus <= 0.0 || one.mb_s() <= 0.0 {
            continue;
        }
        let ratios: Vec<f64> = c
            .rounds_mb_s
            .iter()
            .zip(&one.rounds_mb_s)
            .filter(|(_, o)| **o > 0.0)
            .map(|(k, o)| k / o)
            .collect();
        let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let high = ratios.iter().copied().fold(0.0, f64::max);
        rows.push(Scaling {
            label: format!(
                "{} {} disks={} {}",
                c.engine.name(),
                c.fdmon.name(),
                c.disks,
                c.workload.name()
            ),
            iothreads: c.iothreads,
            speedup: c.mb_s() / one.mb_s(),
            round_speedups: if ratios.is_empty() {
                (0.0, 0.0)
            } else {
                (low, high)
            },
            guest_over_iothread: g / i,
            iothread_busy: i / span,
            ceiling: ceiling(c.iothreads, cpus, g / i),
            one_cpus,
            ceiling_all_threads: bound(c.iothreads, cpus, one_cpus),
        });
    }
    rows
}

/// The scaling rows as a table (empty without rows).
pub fn scaling_table(spec: &MatrixSpec, rows: &[Scaling]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "scaling over one iothread on C = {} CPUs, against min(K, C / (1 + g / i)) (g / i: the \
         guests' CPU per request over the iothread's) and min(K, C / CPUs) (the CPUs all the \
         process's threads used), both at one iothread",
        cpus(spec)
    );
    let _ = writeln!(
        out,
        "{:<32} {:>2} {:>7} {:>11} {:>5} {:>8} {:>7} {:>10} {:>8} {:>9} {:>6}",
        "cell",
        "K",
        "K / one",
        "rounds",
        "g / i",
        "one busy",
        "ceiling",
        "of ceiling",
        "one CPUs",
        "C / CPUs",
        "of it"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<32} {:>2} {:>7.2} {:>5.2}-{:<5.2} {:>5.2} {:>7.0}% {:>7.2} {:>10.2} {:>8.2} {:>9.2} {:>6.2}",
            r.label,
            r.iothreads,
            r.speedup,
            r.round_speedups.0,
            r.round_speedups.1,
            r.guest_over_iothread,
            100.0 * r.iothread_busy,
            r.ceiling,
            r.of_ceiling(),
            r.one_cpus,
            r.ceiling_all_threads,
            r.of_ceiling_all_threads()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_is_the_iothread_count_until_the_guests_take_the_cpus() {
        // Guests free: K iothreads on K CPUs, K times.
        assert_eq!(ceiling(2, 2, 0.0), 2.0);
        // Two CPUs, guests at 0.43 of the iothread's cost (Linux AIO on tmpfs): 1.40.
        assert!((ceiling(2, 2, 0.43) - 2.0 / 1.43).abs() < 1e-12);
        // Enough CPUs for iothreads and guests: the iothreads bound it.
        assert_eq!(ceiling(4, 64, 0.5), 4.0);
        // A negative ratio (no guest CPU recorded) counts as free guests.
        assert_eq!(ceiling(2, 2, -1.0), 2.0);
    }
}
