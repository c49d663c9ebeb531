//! The peers' table and ratios: every run of every variant, grouped by target and queue depth,
//! summed over the rounds, and the ratios the comparison tracks, all from the same run.
//!
//! Mean IOPS is over rounds; mean and p99 latency come from the rounds' merged histograms;
//! CPU per request is the rounds' CPU time over their completed reads.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};

use super::{Sample, Variant};

/// Every run of one variant at one target and depth.
#[derive(Debug, Clone, Default)]
pub struct Runs {
    /// One sample per round, in round order.
    pub rounds: Vec<Sample>,
}

impl Runs {
    /// Mean IOPS over the rounds.
    pub fn iops(&self) -> f64 {
        self.rounds.iter().map(Sample::iops).sum::<f64>() / self.rounds.len().max(1) as f64
    }

    fn merged(&self) -> Histogram<u64> {
        let mut h = aio_bench::load::latency_histogram();
        for s in &self.rounds {
            let _ = h.add(&s.latency_ns);
        }
        h
    }

    /// Mean latency over every measured read of every round, in µs.
    pub fn mean_lat_us(&self) -> f64 {
        self.merged().mean() / 1000.0
    }

    /// p99 latency over every measured read of every round, in µs.
    pub fn p99_us(&self) -> f64 {
        self.merged().value_at_quantile(0.99) as f64 / 1000.0
    }

    /// CPU time per completed read over all rounds, in µs.
    pub fn cpu_us_per_req(&self) -> f64 {
        let cpu: f64 = self.rounds.iter().map(|s| s.cpu_s).sum();
        let n: u64 = self.rounds.iter().map(|s| s.completed).sum();
        1e6 * cpu / n.max(1) as f64
    }

    /// Failed or short reads over all rounds.
    pub fn errors(&self) -> u64 {
        self.rounds.iter().map(|s| s.errors).sum()
    }

    /// Lowest and highest IOPS of a round.
    pub fn iops_range(&self) -> (f64, f64) {
        self.rounds
            .iter()
            .map(Sample::iops)
            .fold((f64::INFINITY, 0.0), |(lo, hi), x| (lo.min(x), hi.max(x)))
    }
}

/// All the runs of one target.
#[derive(Debug, Clone, Default)]
pub struct TargetRuns {
    /// What the target is (`loop device /dev/loop3 (512 MiB)`, `file /tmp/...`).
    pub label: String,
    /// Short name: `loop` or `file`.
    pub name: String,
    /// Runs by queue depth, then variant.
    pub by_qd: BTreeMap<usize, BTreeMap<Variant, Runs>>,
}

impl TargetRuns {
    /// Adds one round's sample.
    pub fn add(&mut self, qd: usize, variant: Variant, sample: Sample) {
        self.by_qd
            .entry(qd)
            .or_default()
            .entry(variant)
            .or_default()
            .rounds
            .push(sample);
    }

    fn runs(&self, qd: usize, v: Variant) -> Option<&Runs> {
        self.by_qd.get(&qd)?.get(&v)
    }

    /// The io_uring peer with the most IOPS at `qd`, and its runs.
    fn best_peer_iops(&self, qd: usize) -> Option<(Variant, &Runs)> {
        let rows = self.by_qd.get(&qd)?;
        rows.iter()
            .filter(|(v, _)| v.is_uring_peer())
            .max_by(|a, b| a.1.iops().total_cmp(&b.1.iops()))
            .map(|(v, r)| (*v, r))
    }

    /// The io_uring peer with the lowest mean latency at `qd`, and its runs.
    fn best_peer_latency(&self, qd: usize) -> Option<(Variant, &Runs)> {
        let rows = self.by_qd.get(&qd)?;
        rows.iter()
            .filter(|(v, _)| v.is_uring_peer())
            .min_by(|a, b| a.1.mean_lat_us().total_cmp(&b.1.mean_lat_us()))
            .map(|(v, r)| (*v, r))
    }

    /// The ratios the comparison tracks, each with its target; missing variants leave theirs
    /// out. The lowest and highest depths stand for QD 1 and QD 32.
    pub fn ratios(&self) -> Vec<Ratio> {
        let mut out = Vec::new();
        let (Some(&lo), Some(&hi)) = (self.by_qd.keys().next(), self.by_qd.keys().last()) else {
            return out;
        };
        for ours in [Variant::AioUringAsync, Variant::AioLinuxAioAsync] {
            if let (Some(o), Some((p, r))) = (self.runs(hi, ours), self.best_peer_iops(hi)) {
                out.push(Ratio::iops(
                    format!("QD{hi} IOPS {ours} / best peer ({p})"),
                    o,
                    r,
                    Goal::AtLeast(1.0),
                ));
            }
            if let (Some(o), Some((p, r))) = (self.runs(lo, ours), self.best_peer_latency(lo)) {
                out.push(Ratio::latency(
                    format!("QD{lo} mean latency {ours} / best peer ({p})"),
                    o,
                    r,
                    Goal::AtMost(1.0),
                ));
            }
        }
        let pairs = [
            (Variant::AioUringAsync, Variant::AioUringCallback),
            (Variant::AioLinuxAioAsync, Variant::AioLinuxAioCallback),
        ];
        for (a, c) in pairs {
            if let (Some(x), Some(y)) = (self.runs(hi, a), self.runs(hi, c)) {
                out.push(Ratio::iops(
                    format!("QD{hi} IOPS {a} / {c}"),
                    x,
                    y,
                    Goal::AtLeast(0.97),
                ));
            }
            if let (Some(x), Some(y)) = (self.runs(lo, a), self.runs(lo, c)) {
                out.push(Ratio::latency(
                    format!("QD{lo} mean latency {a} / {c}"),
                    x,
                    y,
                    Goal::AtMost(1.05),
                ));
            }
        }
        let (pool, tokio) = (Variant::AioPoolAsync, Variant::TokioSpawnBlocking);
        for ours in [pool, Variant::AioPoolRunAsync] {
            if let (Some(x), Some(y)) = (self.runs(hi, ours), self.runs(hi, tokio)) {
                out.push(Ratio::iops(
                    format!("QD{hi} IOPS {ours} / {tokio}"),
                    x,
                    y,
                    Goal::None,
                ));
            }
            if let (Some(x), Some(y)) = (self.runs(lo, ours), self.runs(lo, tokio)) {
                out.push(Ratio::latency(
                    format!("QD{lo} mean latency {ours} / {tokio}"),
                    x,
                    y,
                    Goal::None,
                ));
            }
        }
        out
    }

    /// The table and the ratios, as text.
    pub fn print(&self) {
        println!("\n== {} ==", self.label);
        println!(
            "{:>4} {:<24} {:>10} {:>19} {:>10} {:>10} {:>11} {:>6}",
            "QD",
            "variant",
            "IOPS",
            "(rounds min-max)",
            "mean us",
            "p99 us",
            "CPU us/req",
            "errors"
        );
        for (qd, rows) in &self.by_qd {
            for (v, r) in rows {
                let (lo, hi) = r.iops_range();
                println!(
                    "{:>4} {:<24} {:>10.0} {:>19} {:>10.1} {:>10.1} {:>11.2} {:>6}",
                    qd,
                    v.name(),
                    r.iops(),
                    format!("({lo:.0}-{hi:.0})"),
                    r.mean_lat_us(),
                    r.p99_us(),
                    r.cpu_us_per_req(),
                    r.errors()
                );
            }
        }
        for ratio in self.ratios() {
            println!("  {ratio}");
        }
    }

    /// The target's rows and ratios as JSON.
    pub fn to_json(&self) -> Value {
        let mut rows = Vec::new();
        for (&qd, vs) in &self.by_qd {
            for (v, r) in vs {
                let rounds = r.rounds.iter().map(RoundRecord::new).collect();
                rows.push(RowRecord {
                    qd,
                    variant: v.name(),
                    iops: r.iops(),
                    mean_lat_us: r.mean_lat_us(),
                    p99_us: r.p99_us(),
                    cpu_us_per_req: r.cpu_us_per_req(),
                    errors: r.errors(),
                    rounds,
                });
            }
        }
        let ratios = self.ratios();
        let ratios: Vec<RatioRecord> = ratios.iter().map(RatioRecord::new).collect();
        json!({ "target": self.name, "label": self.label, "rows": rows, "ratios": ratios })
    }
}

/// A variant at a queue depth in the JSON report: the medians and every round.
#[derive(Serialize)]
struct RowRecord {
    qd: usize,
    variant: &'static str,
    iops: f64,
    mean_lat_us: f64,
    p99_us: f64,
    cpu_us_per_req: f64,
    errors: u64,
    rounds: Vec<RoundRecord>,
}

/// One round of a variant in the JSON report.
#[derive(Serialize)]
struct RoundRecord {
    iops: f64,
    mean_lat_us: f64,
    p99_us: f64,
    cpu_us_per_req: f64,
    cpu_s: f64,
    completed: u64,
    errors: u64,
    loop_counters: BTreeMap<&'static str, u64>,
}

impl RoundRecord {
    fn new(s: &Sample) -> Self {
        RoundRecord {
            iops: s.iops(),
            mean_lat_us: s.mean_lat_us(),
            p99_us: s.p99_us(),
            cpu_us_per_req: s.cpu_us_per_req(),
            cpu_s: s.cpu_s,
            completed: s.completed,
            errors: s.errors,
            loop_counters: s.counters.iter().copied().collect(),
        }
    }
}

/// A ratio in the JSON report, with its goal (`>=`, `<=` or empty) and verdict.
#[derive(Serialize)]
struct RatioRecord<'a> {
    name: &'a str,
    value: f64,
    per_round: &'a [f64],
    median_of_rounds: f64,
    goal: &'static str,
    target: Option<f64>,
    met: Option<bool>,
}

impl<'a> RatioRecord<'a> {
    fn new(r: &'a Ratio) -> Self {
        let (goal, target) = match r.goal {
            Goal::AtLeast(t) => (">=", Some(t)),
            Goal::AtMost(t) => ("<=", Some(t)),
            Goal::None => ("", None),
        };
        RatioRecord {
            name: &r.name,
            value: r.value,
            per_round: &r.per_round,
            median_of_rounds: r.median(),
            goal,
            target,
            met: r.met(),
        }
    }
}

/// What a ratio should be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// At least this much (IOPS ratios).
    AtLeast(f64),
    /// At most this much (latency ratios).
    AtMost(f64),
    /// Reported without a target.
    None,
}

/// One ratio of two variants' figures from the same run: of their means over the rounds, and
/// round by round (each round runs both within seconds of each other).
#[derive(Debug, Clone)]
pub struct Ratio {
    /// What is divided by what.
    pub name: String,
    /// The quotient of the means over the rounds.
    pub value: f64,
    /// The quotient in each round.
    pub per_round: Vec<f64>,
    /// Its target.
    pub goal: Goal,
}

impl Ratio {
    /// `a`'s IOPS over `b`'s.
    fn iops(name: String, a: &Runs, b: &Runs, goal: Goal) -> Ratio {
        let per_round = a
            .rounds
            .iter()
            .zip(&b.rounds)
            .map(|(x, y)| x.iops() / y.iops())
            .collect();
        Ratio {
            name,
            value: a.iops() / b.iops(),
            per_round,
            goal,
        }
    }

    /// `a`'s mean latency over `b`'s.
    fn latency(name: String, a: &Runs, b: &Runs, goal: Goal) -> Ratio {
        let per_round = a
            .rounds
            .iter()
            .zip(&b.rounds)
            .map(|(x, y)| x.mean_lat_us() / y.mean_lat_us())
            .collect();
        Ratio {
            name,
            value: a.mean_lat_us() / b.mean_lat_us(),
            per_round,
            goal,
        }
    }

    /// The median of the per-round quotients.
    pub fn median(&self) -> f64 {
        aio_bench::rounds::median(&self.per_round).unwrap_or(f64::NAN)
    }

    /// Whether the ratio meets its target (`None` without one).
    pub fn met(&self) -> Option<bool> {
        match self.goal {
            Goal::AtLeast(t) => Some(self.value >= t),
            Goal::AtMost(t) => Some(self.value <= t),
            Goal::None => None,
        }
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = match (self.goal, self.met()) {
            (Goal::AtLeast(t), Some(ok)) => format!(" (target >= {t}: {})", ok_or_miss(ok)),
            (Goal::AtMost(t), Some(ok)) => format!(" (target <= {t}: {})", ok_or_miss(ok)),
            _ => String::new(),
        };
        let rounds: Vec<String> = self.per_round.iter().map(|r| format!("{r:.2}")).collect();
        write!(
            f,
            "{:<62} {:>6.3}{verdict}; rounds {} (median {:.3})",
            self.name,
            self.value,
            rounds.join(" "),
            self.median()
        )
    }
}

fn ok_or_miss(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(iops: &[u64]) -> Runs {
        Runs {
            rounds: iops
                .iter()
                .map(|&n| Sample {
                    latency_ns: aio_bench::load::latency_histogram(),
                    measured: n,
                    completed: n,
                    errors: 0,
                    window_s: 1.0,
                    cpu_s: 0.5,
                    counters: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn ratios_of_means_and_per_round_median() {
        let r = Ratio::iops(
            "a / b".into(),
            &runs(&[100, 300, 200]),
            &runs(&[100, 100, 100]),
            Goal::AtLeast(1.0),
        );
        assert!((r.value - 2.0).abs() < 1e-9);
        assert_eq!(r.per_round, vec![1.0, 3.0, 2.0]);
        assert!((r.median() - 2.0).abs() < 1e-9);
        assert_eq!(r.met(), Some(true));
        let miss = Ratio::iops(
            "b / a".into(),
            &runs(&[1]),
            &runs(&[2]),
            Goal::AtLeast(0.97),
        );
        assert_eq!(miss.met(), Some(false));
    }

    #[test]
    fn best_peer_is_an_io_uring_runtime() {
        let mut t = TargetRuns::default();
        for (v, n) in [
            (Variant::TokioUring, 10),
            (Variant::Monoio, 30),
            (Variant::AioUringAsync, 20),
            (Variant::TokioSpawnBlocking, 99),
        ] {
            for s in runs(&[n]).rounds {
                t.add(32, v, s);
            }
        }
        let (best, _) = t.best_peer_iops(32).unwrap();
        assert_eq!(best, Variant::Monoio);
        let first = &t.ratios()[0];
        assert!(first.name.contains("best peer (monoio)"));
        assert!((first.value - 20.0 / 30.0).abs() < 1e-9);
    }
}
