//! fio's two report formats for a run of job files: the text summary and the JSON field names
//! (`jobs[].jobname`, `read` / `write` / `trim` with `io_bytes`, `bw_bytes`, `iops`, `lat_ns`
//! and `clat_ns` with `percentile` keyed like `"99.000000"`).
//!
//! This module owns the formatting only, never the running ([`super::runner`]). Latency here is
//! submit-to-completion as the application sees it: fio's `lat_ns`. `clat_ns` carries the same
//! figures (our engines do not time submission separately), and there is no `slat_ns`.

use std::fmt::Write as _;
use std::time::Duration;

use aio_loop::LoopCounters;
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use aio_loop::PollMaxNs;

use super::runner::JobReport;
use crate::load::Tally;

/// The percentiles fio reports by default, as fractions.
const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// fio's text summary of `reports`.
pub fn to_normal(reports: &[JobReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let d = &r.def;
        let _ = writeln!(
            out,
            "{}: (groupid=0, jobs={}): err= {}: rw={}, bs={}, iodepth={}, engine={}, fdmon={}, disks={}, iothreads={}, poll_max_ns={}, file={}",
            d.name,
            d.numjobs,
            r.result.first_errno.unwrap_or(0),
            d.rw,
            d.bs,
            d.iodepth,
            r.engine,
            r.fdmon,
            d.disks,
            d.iothreads,
            d.poll_max_ns,
            r.file.display()
        );
        let ms = r.result.elapsed.as_millis();
        let sides = [
            ("read", &r.result.read),
            ("write", &r.result.write),
            ("trim", &r.result.trim),
        ];
        for (side, st) in sides {
            if st.ios == 0 {
                continue;
            }
            let secs = r.result.elapsed.as_secs_f64();
            let h = &st.latency_ns;
            let _ = writeln!(
                out,
                "  {side}: IOPS={}, BW={:.1}MiB/s ({:.1}MB/s)({:.1}MiB/{ms}msec)",
                si(st.ios as f64 / secs),
                st.bytes as f64 / secs / (1 << 20) as f64,
                st.bytes as f64 / secs / 1e6,
                st.bytes as f64 / (1 << 20) as f64,
            );
            let _ = writeln!(
                out,
                "    lat (usec): min={:.1}, max={:.1}, avg={:.2}, stdev={:.2}",
                h.min() as f64 / 1e3,
                h.max() as f64 / 1e3,
                h.mean() / 1e3,
                h.stdev() / 1e3
            );
            let _ = write!(out, "    lat percentiles (usec):");
            for (i, p) in PERCENTILES.iter().enumerate() {
                if i % 4 == 0 {
                    let _ = write!(out, "\n     |");
                }
                let _ = write!(
                    out,
                    " {p:5.2}th=[{:>6.1}],",
                    h.value_at_quantile(p / 100.0) as f64 / 1e3
                );
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "  cpu          : loop threads {:.1}% of one CPU",
            100.0 * r.result.iothread_cpu_s / r.result.wall_s.max(1e-9)
        );
        out.push('\n');
    }
    out
}

fn lat_json(h: &Histogram<u64>, with_percentiles: bool) -> Value {
    let mut v = json!({
        "min": if h.is_empty() { 0 } else { h.min() },
        "max": h.max(),
        "mean": h.mean(),
        "stddev": h.stdev(),
        "N": h.len(),
    });
    if with_percentiles && !h.is_empty() {
        let pct: Map<String, Value> = PERCENTILES
            .iter()
            .map(|p| (format!("{p:.6}"), json!(h.value_at_quantile(p / 100.0))))
            .collect();
        v["percentile"] = Value::Object(pct);
    }
    v
}

fn side_json(st: &Tally, elapsed: Duration) -> Value {
    let secs = elapsed.as_secs_f64();
    json!({
        "io_bytes": st.bytes,
        "io_kbytes": st.bytes / 1024,
        "bw_bytes": (st.bytes as f64 / secs) as u64,
        "bw": (st.bytes as f64 / secs / 1024.0) as u64,
        "iops": st.ios as f64 / secs,
        "runtime": elapsed.as_millis() as u64,
        "total_ios": st.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "lat_ns": lat_json(&st.latency_ns, true),
        "clat_ns": lat_json(&st.latency_ns, true),
    })
}

/// Every loop counter of a job, by its field name: why a figure is what it is.
pub fn counters_json(k: &LoopCounters) -> Value {
    Value::Object(
        k.named()
            .into_iter()
            .map(|(name, v)| (name.to_string(), json!(v)))
            .collect(),
    )
}

/// fio's JSON output (`--output-format=json`) for `reports`.
pub fn to_fio_json(reports: &[JobReport]) -> Value {
    let jobs: Vec<Value> = reports
        .iter()
        .map(|r| {
            let d = &r.def;
            json!({
                "jobname": d.name,
                "groupid": 0,
                "error": r.result.first_errno.unwrap_or(0),
                "job options": {
                    "rw": d.rw.fio_name(),
                    "bs": d.bs.to_string(),
                    "iodepth": d.iodepth.to_string(),
                    "numjobs": d.numjobs.to_string(),
                    "ioengine": crate::fio::ioengine(r.engine),
                    "sync": if d.fua { "dsync" } else { "none" },
                },
                "read": side_json(&r.result.read, r.result.elapsed),
                "write": side_json(&r.result.write, r.result.elapsed),
                "trim": side_json(&r.result.trim, r.result.elapsed),
                "job_runtime": r.result.elapsed.as_millis() as u64,
                "aio-bench": {
                    "engine": r.engine.name(),
                    "fdmon": r.fdmon.name(),
                    "disks": d.disks,
                    "iothreads": d.iothreads,
                    "poll_max_ns": poll_max_ns_json(d.poll_max_ns),
                    "file": r.file.display().to_string(),
                    "errors": r.result.errors,
                    "iothread_cpu_s": r.result.iothread_cpu_s,
                    "counters": counters_json(&r.result.counters),
                },
            })
        })
        .collect();
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({
        "fio version": format!("aio-bench-{}", env!("CARGO_PKG_VERSION")),
        "timestamp": timestamp,
        "jobs": jobs,
    })
}

/// A `poll_max_ns` in JSON: the number of ns, or `"auto"`.
pub fn poll_max_ns_json(p: PollMaxNs) -> Value {
    match p {
        PollMaxNs::Fixed(ns) => json!(ns),
        PollMaxNs::Auto => json!("auto"),
    }
}
