//! The matrix's reports: the terminal table shaped as in the QEMU epoll discussion, CSV, an
//! SVG chart and JSON.
//!
//! This module owns the report formats and their field names only; it runs nothing.

use std::fmt::Write as _;

use serde::Serialize;

use super::cell::Cell;
use super::spec::MatrixSpec;
use crate::scsi::GuestSched;

/// The scsi-disk scaling table, shaped as in the QEMU epoll discussion: one per engine, a row
/// per disk count and iothread count, a column group per fd monitor with a column per
/// workload, in MB/s.
pub fn table(spec: &MatrixSpec, cells: &[Cell]) -> String {
    let mut out = String::new();
    let width = 8 * spec.workloads.len();
    let queues = spec.cell.queues;
    for &engine in &spec.engines {
        let _ = writeln!(
            out,
            "engine {engine} (MB/s), {} memory, {queues} queue{} per disk{}",
            spec.cell.memory.name(),
            if queues == 1 { "" } else { "s" },
            match spec.cell.guest_sched {
                GuestSched::Normal => "",
                GuestSched::Batch => ", guests SCHED_BATCH",
            }
        );
        let _ = write!(out, "{:>10} {:>9} ", "disks", "iothreads");
        for f in &spec.fdmons {
            let _ = write!(out, "| {:^width$} ", f.name());
        }
        out.push('\n');
        let _ = write!(out, "{:>10} {:>9} ", "", "");
        for _ in &spec.fdmons {
            out.push_str("| ");
            for w in &spec.workloads {
                let _ = write!(out, "{:>7} ", w.name());
            }
        }
        out.push('\n');
        for &d in &spec.disks {
            for &k in &spec.iothreads {
                let _ = write!(out, "{d:>10} {k:>9} ");
                for &f in &spec.fdmons {
                    out.push_str("| ");
                    for &w in &spec.workloads {
                        let v = cells
                            .iter()
                            .find(|c| {
                                c.engine == engine
                                    && c.fdmon == f
                                    && c.disks == d
                                    && c.workload == w
                                    && c.iothreads == k
                            })
                            .map(|c| format!("{:.1}", c.mb_s()))
                            .unwrap_or_else(|| "-".into());
                        let _ = write!(out, "{v:>7} ");
                    }
                }
                out.push('\n');
            }
        }
        out.push('\n');
    }
    out
}

/// The CSV report: the JSON's fields as columns, one row per cell (each iothread's CPU time
/// in one column, `;`-separated).
pub fn to_csv(spec: &MatrixSpec, cells: &[Cell]) -> String {
    let mut out = String::from(
        "fdmon,engine,disks,active,workload,bs,iodepth,memory,iothreads,queues,mb_s,iops,lat_us_mean,lat_us_p50,lat_us_p99,lat_us_p999,iothread_cpu_s,iothread_cpu_s_each,guest_cpu_s,process_cpu_s,interrupts,guest_waits,iterations,blocking_waits,notifier_writes,poll_hits,busy_poll_ns,errors\n",
    );
    for c in cells {
        let r = CellRecord::new(spec, c);
        let (l, k) = (&r.lat_us, &r.counters);
        let each: Vec<String> = r
            .per_iothread
            .iter()
            .map(|t| format!("{:.4}", t.cpu_s))
            .collect();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{:.3},{:.1},{:.2},{:.2},{:.2},{:.2},{:.4},{},{:.4},{:.4},{},{},{},{},{},{},{},{}",
            r.fdmon,
            r.engine,
            r.disks,
            r.active,
            r.workload,
            r.bs,
            r.iodepth,
            r.memory,
            r.iothreads,
            r.queues,
            r.mb_s,
            r.iops,
            l.mean,
            l.p50,
            l.p99,
            l.p999,
            r.iothread_cpu_s,
            each.join(";"),
            r.guest_cpu_s,
            r.process_cpu_s,
            r.interrupts,
            r.guest_waits,
            k.iterations,
            k.blocking_waits,
            k.notifier_writes,
            k.poll_hits,
            k.busy_poll_ns,
            k.errors
        );
    }
    out
}

/// One chart's lines: a label and its points.
type Series = Vec<(String, Vec<(f64, f64)>)>;

/// An SVG chart, one panel per workload, stacked: MB/s against disk count, a line per fd
/// monitor and engine (and iothread count, when there are several). With several iothread
/// counts (`--iothreads 1,2`) a second panel per workload draws the scaling: MB/s against
/// iothreads, a line per fd monitor, engine and disk count.
pub fn to_svg(spec: &MatrixSpec, cells: &[Cell]) -> Result<String, String> {
    use plotters::prelude::*;
    let scaling = spec.iothreads.len() > 1;
    let mut panels: Vec<(String, &str, f64, Series)> = Vec::new();
    let what = format!(
        "bs {}, iodepth {}, active {}, {} queue(s) per disk",
        spec.cell.bs,
        spec.cell.iodepth,
        if spec.active_all { "all" } else { "one" },
        spec.cell.queues
    );
    let max_disks = spec.disks.iter().copied().max().unwrap_or(1) as f64;
    let max_k = spec.iothreads.iter().copied().max().unwrap_or(1) as f64;
    for &workload in &spec.workloads {
        let ours: Vec<&Cell> = cells.iter().filter(|c| c.workload == workload).collect();
        let mut by_disks = Series::new();
        let mut by_k = Series::new();
        for &engine in &spec.engines {
            for &fdmon in &spec.fdmons {
                let line = |keep: &dyn Fn(&Cell) -> bool, x: &dyn Fn(&Cell) -> f64| {
                    let mut points: Vec<(f64, f64)> = ours
                        .iter()
                        .filter(|c| c.engine == engine && c.fdmon == fdmon && keep(c))
                        .map(|c| (x(c), c.mb_s()))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    points
                };
                for &k in &spec.iothreads {
                    let label = if scaling {
                        format!("{engine} / {fdmon}, {k} iothread(s)")
                    } else {
                        format!("{engine} / {fdmon}")
                    };
                    by_disks.push((label, line(&|c| c.iothreads == k, &|c| c.disks as f64)));
                }
                for &d in spec.disks.iter().filter(|_| scaling) {
                    let label = format!("{engine} / {fdmon}, {d} disks");
                    by_k.push((label, line(&|c| c.disks == d, &|c| c.iothreads as f64)));
                }
            }
        }
        panels.push((
            format!("{} ({what}): MB/s vs disks", workload.name()),
            "disks attached",
            max_disks,
            by_disks,
        ));
        if scaling {
            panels.push((
                format!("{} ({what}): MB/s vs iothreads", workload.name()),
                "iothreads",
                max_k,
                by_k,
            ));
        }
    }
    let mut svg = String::new();
    {
        let rows = panels.len().max(1);
        let root = SVGBackend::with_string(&mut svg, (900, 420 * rows as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((rows, 1));
        for (area, (caption, x_desc, x_max, series)) in areas.iter().zip(panels) {
            let top = series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
                .fold(1.0, f64::max)
                * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d((1f64..x_max.max(2.0)).log_scale(), 0f64..top)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc("MB/s")
                .draw()
                .map_err(|e| e.to_string())?;
            for (index, (label, points)) in series.into_iter().enumerate() {
                let color = Palette99::pick(index).to_rgba();
                // A marker per point, so that a line of one point shows too.
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::LowerLeft)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The JSON report (`{"machine": {...}, "cells": [...], "scaling": [...]}`: the cells with the
/// issue's field names, and with `--iothreads 1,K` each K cell against its one-iothread cell).
pub fn to_json(spec: &MatrixSpec, cells: &[Cell]) -> serde_json::Value {
    let scaling = super::scaling::scaling(spec, cells);
    let report = Report {
        machine: Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        },
        cells: cells.iter().map(|c| CellRecord::new(spec, c)).collect(),
        scaling: scaling
            .iter()
            .map(|row| ScalingRecord {
                row,
                of_ceiling: row.of_ceiling(),
                of_ceiling_all_threads: row.of_ceiling_all_threads(),
            })
            .collect(),
    };
    serde_json::to_value(report).expect("the report serializes")
}

/// The JSON report's shape.
#[derive(Serialize)]
struct Report<'a> {
    machine: Machine,
    cells: Vec<CellRecord<'a>>,
    scaling: Vec<ScalingRecord<'a>>,
}

/// A scaling row with its two quotients over the ceilings.
#[derive(Serialize)]
struct ScalingRecord<'a> {
    #[serde(flatten)]
    row: &'a super::scaling::Scaling,
    of_ceiling: f64,
    of_ceiling_all_threads: f64,
}

/// Where the matrix ran.
#[derive(Serialize)]
struct Machine {
    cpus: usize,
    kernel: String,
}

/// One cell: its axes, its figures and its loop counters.
#[derive(Serialize)]
struct CellRecord<'a> {
    fdmon: &'static str,
    engine: &'static str,
    disks: usize,
    active: &'static str,
    workload: &'static str,
    bs: usize,
    iodepth: usize,
    memory: &'static str,
    iothreads: usize,
    queues: usize,
    guest_sched: &'static str,
    mb_s: f64,
    mb_s_rounds: &'a [f64],
    iops: f64,
    lat_us: Latency,
    iothread_cpu_s: f64,
    guest_cpu_s: f64,
    process_cpu_s: f64,
    interrupts: u64,
    guest_waits: u64,
    per_iothread: Vec<IothreadRecord>,
    counters: Counters,
}

/// Latency, µs.
#[derive(Serialize)]
struct Latency {
    mean: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

/// One iothread of a cell: its queues, its CPU time and its loop's counters by name.
#[derive(Serialize)]
struct IothreadRecord {
    queues: usize,
    cpu_s: f64,
    counters: serde_json::Value,
}

/// The cell's loop counters and its request outcomes.
#[derive(Serialize)]
struct Counters {
    iterations: u64,
    blocking_waits: u64,
    nonblocking_waits: u64,
    notifier_writes: u64,
    poll_hits: u64,
    busy_poll_ns: u64,
    handler_calls: u64,
    errors: u64,
    verified_reads: u64,
    verify_errors: u64,
}

impl<'a> CellRecord<'a> {
    fn new(spec: &MatrixSpec, c: &'a Cell) -> Self {
        let (r, h, k) = (&c.result, &c.result.latency_ns, &c.result.counters);
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        CellRecord {
            fdmon: c.fdmon.name(),
            engine: c.engine.name(),
            disks: c.disks,
            active: if spec.active_all { "all" } else { "one" },
            workload: c.workload.name(),
            bs: spec.cell.bs,
            iodepth: spec.cell.iodepth,
            memory: spec.cell.memory.name(),
            iothreads: c.iothreads,
            queues: c.queues,
            guest_sched: spec.cell.guest_sched.name(),
            mb_s: c.mb_s(),
            mb_s_rounds: &c.rounds_mb_s,
            iops: c.iops(),
            lat_us: Latency {
                mean: h.mean() / 1000.0,
                p50: us(0.5),
                p99: us(0.99),
                p999: us(0.999),
            },
            iothread_cpu_s: r.iothread_cpu_s,
            guest_cpu_s: r.guest_cpu_s,
            process_cpu_s: r.process_cpu_s,
            interrupts: r.interrupts,
            guest_waits: r.guest_waits,
            per_iothread: r
                .per_iothread
                .iter()
                .map(|t| IothreadRecord {
                    queues: t.queues,
                    cpu_s: t.cpu_s,
                    counters: crate::fio::output::counters_json(&t.counters),
                })
                .collect(),
            counters: Counters {
                iterations: k.iterations,
                blocking_waits: k.blocking_waits,
                nonblocking_waits: k.nonblocking_waits,
                notifier_writes: k.notifier_writes,
                poll_hits: k.poll_hits,
                busy_poll_ns: k.busy_poll_ns,
                handler_calls: k.handler_calls,
                errors: r.errors,
                verified_reads: r.verified_reads,
                verify_errors: r.verify_errors,
            },
        }
    }
}
