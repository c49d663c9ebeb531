//! The matrix's own tests: small matrices through every path, and their reports.

use super::*;
use crate::scsi::CellSpec;
#[allow(unused_imports)]
use std::time::Duration;

#[cfg(all(feature = "pool", feature = "poll", feature = "epoll"))]
fn spec(memory: crate::scsi::MemoryPath) -> MatrixSpec {
    let quick = MatrixSpec::quick();
    MatrixSpec {
        fdmons: vec![MonitorKind::Poll, MonitorKind::Epoll],
        engines: vec![EngineKind::Pool],
        disks: vec![1, 4],
        cell: CellSpec {
            iodepth: 4,
            runtime: Duration::from_millis(150),
            ramp: Duration::from_millis(20),
            poll_idle: Duration::from_millis(10),
            verify: true,
            memory,
            ..quick.cell
        },
        disk_size: 1 << 20,
        repeat: 2,
        ..quick
    }
}

#[test]
fn workloads_parse_and_unknown_is_an_error() {
    for w in Workload::ALL {
        assert_eq!(w.name().parse::<Workload>().unwrap(), w);
    }
    assert!("seq".parse::<Workload>().unwrap_err().contains("seq"));
}

#[test]
#[cfg(all(feature = "pool", feature = "poll", feature = "epoll"))]
fn a_small_matrix_runs_every_cell_and_reports_it() {
    let spec = spec(crate::scsi::MemoryPath::Guest);
    let dir = std::env::temp_dir().join(format!("aio-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = 0;
    let cells = run(&spec, &dir, |_, n, _| {
        seen += 1;
        assert_eq!(n, 16, "8 cells, 2 rounds");
    })
    .unwrap();
    assert_eq!((cells.len(), seen), (8, 16));
    for c in &cells {
        assert!(
            c.result.ios > 0,
            "{:?} {:?} moved no data",
            c.fdmon,
            c.workload
        );
        assert_eq!(c.result.errors, 0);
        assert!(c.mb_s() > 0.0);
        assert_eq!(c.result.verify_errors, 0, "{:?}", c.result.verify_reports);
        if c.workload == Workload::RandRw {
            assert!(c.result.verified_reads > 0, "randrw reads are verified");
        }
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "disk images are removed"
    );
    std::fs::remove_dir(&dir).unwrap();
    let table = table(&spec, &cells);
    assert!(table.contains("engine pool (MB/s), guest memory") && table.contains("randrw"));
    let svg = to_svg(&spec, &cells).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("pool / poll") && svg.contains("MB/s"));
    let csv = to_csv(&spec, &cells);
    assert_eq!(csv.lines().count(), 9, "a header and a row per cell");
    assert!(csv.starts_with(
        "fdmon,engine,disks,active,workload,bs,iodepth,memory,iothreads,queues,mb_s,iops"
    ));
    assert!(csv.lines().nth(1).unwrap().contains(",guest,"), "{csv}");
    let json = to_json(&spec, &cells);
    let c0 = &json["cells"][0];
    for key in [
        "fdmon",
        "engine",
        "disks",
        "active",
        "workload",
        "bs",
        "iodepth",
        "memory",
        "iothreads",
        "queues",
        "mb_s",
        "mb_s_rounds",
        "guest_cpu_s",
        "per_iothread",
        "iops",
        "iothread_cpu_s",
        "counters",
    ] {
        assert!(!c0[key].is_null(), "field {key} missing");
    }
    for key in ["mean", "p50", "p99", "p999"] {
        assert!(c0["lat_us"][key].is_number(), "lat_us.{key} missing");
    }
}

/// The copy path (`--bounce`) moves the same data: verified reads and writes on both
/// workloads, over a fd monitor each.
#[test]
#[cfg(all(feature = "pool", feature = "poll", feature = "epoll"))]
fn the_bounce_path_runs_verified() {
    let spec = MatrixSpec {
        repeat: 1,
        disks: vec![2],
        active_all: true,
        ..spec(crate::scsi::MemoryPath::Bounce)
    };
    let dir = std::env::temp_dir().join(format!("aio-bench-bounce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cells = run(&spec, &dir, |_, _, _| {}).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    assert_eq!(cells.len(), 4);
    for c in &cells {
        assert!(c.result.ios > 0 && c.result.errors == 0, "{c:?}");
        assert_eq!(c.result.verify_errors, 0, "{:?}", c.result.verify_reports);
        // Every request of the misaligned guest went through the device's bounce buffers.
        let bounced: u64 = c.result.per_iothread.iter().map(|t| t.bounced).sum();
        assert!(bounced > 0, "{c:?}");
    }
    assert!(cells.iter().any(|c| c.result.verified_reads > 0));
    assert_eq!(to_json(&spec, &cells)["cells"][0]["memory"], "bounce");
    assert!(table(&spec, &cells).contains("engine pool (MB/s), bounce memory"));
}

/// A small verified matrix on `iothreads` iothreads with `queues` queues per disk, every disk
/// driven, over epoll with each engine of `engines` (those the kernel refuses are skipped).
#[cfg(feature = "epoll")]
fn threaded(
    tag: &str,
    engines: &[EngineKind],
    disks: usize,
    (iothreads, queues): (Vec<usize>, usize),
    memory: crate::scsi::MemoryPath,
) -> (MatrixSpec, Vec<Cell>) {
    let engines: Vec<EngineKind> = engines
        .iter()
        .copied()
        .filter(|&k| {
            aio_conformance::available(
                &format!("engine {k}"),
                k.build(&aio::EngineOptions::default()),
            )
            .is_some()
        })
        .collect();
    let quick = MatrixSpec::quick();
    let spec = MatrixSpec {
        fdmons: vec![MonitorKind::Epoll],
        engines,
        disks: vec![disks],
        workloads: vec![Workload::RandRw],
        active_all: true,
        cell: CellSpec {
            iodepth: 4,
            runtime: Duration::from_millis(150),
            ramp: Duration::from_millis(20),
            poll_idle: Duration::from_millis(10),
            verify: true,
            queues,
            memory,
            ..quick.cell
        },
        disk_size: 1 << 20,
        iothreads,
        ..quick
    };
    let dir = std::env::temp_dir().join(format!("aio-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cells = run(&spec, &dir, |_, _, _| {}).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    (spec, cells)
}

/// QEMU's iothread-vq-mapping in the matrix: 16 disks on two iothreads, every engine, with
/// verify: every read holds what was last written, and both iothreads did work.
#[test]
#[cfg(all(
    feature = "epoll",
    feature = "pool",
    feature = "linux-aio",
    feature = "uring"
))]
fn two_iothreads_verify_sixteen_disks_on_every_engine() {
    let (spec, cells) = threaded(
        "iot2",
        &EngineKind::ALL,
        16,
        (vec![2], 1),
        crate::scsi::MemoryPath::Guest,
    );
    assert_eq!(cells.len(), spec.engines.len());
    for c in &cells {
        let r = &c.result;
        assert!(r.ios > 0 && r.errors == 0, "{}: {r:?}", c.engine);
        assert_eq!(r.verify_errors, 0, "{}: {:?}", c.engine, r.verify_reports);
        assert!(r.verified_reads > 0, "{}: reads are verified", c.engine);
        assert_eq!((c.iothreads, c.queues), (2, 1));
        assert_eq!(r.per_iothread.len(), 2);
        for (t, it) in r.per_iothread.iter().enumerate() {
            assert_eq!(it.queues, 8, "{}: disks d % 2 == {t}", c.engine);
            assert!(
                it.counters.handler_calls > 0,
                "{}: iothread {t} idle",
                c.engine
            );
        }
        // Interrupts came (one per batch of completions), and guests waited for them.
        assert!(r.interrupts > 0 && r.guest_waits > 0, "{r:?}");
        let merged: u64 = r
            .per_iothread
            .iter()
            .map(|t| t.counters.handler_calls)
            .sum();
        assert_eq!(r.counters.handler_calls, merged);
    }
}

/// Several queues per disk, spread over three iothreads, and a list of iothread counts: every
/// count runs, verified on the copy path (the guests' buffers misaligned, so the device
/// bounces every request), and K and Q are in the table, the CSV, the JSON and the SVG.
#[test]
#[cfg(all(feature = "epoll", feature = "linux-aio"))]
fn queues_and_iothread_lists_run_verified_and_are_reported() {
    let (spec, cells) = threaded(
        "iotq",
        &[EngineKind::LinuxAio],
        2,
        (vec![1, 3], 3),
        crate::scsi::MemoryPath::Bounce,
    );
    if spec.engines.is_empty() {
        return;
    }
    assert_eq!(cells.len(), 2 * spec.engines.len());
    for c in &cells {
        let r = &c.result;
        assert!(r.ios > 0 && r.errors == 0, "{r:?}");
        assert_eq!(r.verify_errors, 0, "{:?}", r.verify_reports);
        assert_eq!(r.per_iothread.len(), c.iothreads);
        // Six queues: (d * 3 + q) % K.
        let served: Vec<usize> = r.per_iothread.iter().map(|t| t.queues).collect();
        let expect = if c.iothreads == 1 {
            vec![6]
        } else {
            vec![2, 2, 2]
        };
        assert_eq!(served, expect);
        assert_eq!(c.rounds_mb_s.len(), 1);
        // Interrupts per batch: the guests got every completion, with interrupts to spare.
        assert!(r.interrupts > 0 && r.guest_waits > 0, "{r:?}");
    }
    let csv = to_csv(&spec, &cells);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let ks: Vec<&str> = rows.iter().map(|r| r[col("iothreads")]).collect();
    assert_eq!(ks, ["1", "3"]);
    assert!(rows.iter().all(|r| r[col("queues")] == "3"));
    assert_eq!(rows[1][col("iothread_cpu_s_each")].split(';').count(), 3);
    let json = to_json(&spec, &cells);
    assert_eq!(json["cells"][1]["iothreads"], 3);
    assert_eq!(json["cells"][1]["queues"], 3);
    assert_eq!(
        json["cells"][1]["per_iothread"].as_array().unwrap().len(),
        3
    );
    assert!(json["cells"][1]["per_iothread"][0]["counters"]["iterations"].is_u64());
    let table = table(&spec, &cells);
    assert!(
        table.contains("3 queues per disk") && table.contains("iothreads"),
        "{table}"
    );
    let svg = to_svg(&spec, &cells).unwrap();
    assert!(svg.contains("MB/s vs iothreads") && svg.contains("MB/s vs disks"));
    // The K = 3 cell against the K = 1 cell: one scaling row, from the two cells' figures.
    let rows = scaling(&spec, &cells);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!(r.iothreads, 3);
    assert!((r.speedup - cells[1].mb_s() / cells[0].mb_s()).abs() < 1e-9);
    let g_over_i = cells[0].result.guest_cpu_s / cells[0].result.iothread_cpu_s;
    assert!((r.guest_over_iothread - g_over_i).abs() < 1e-12);
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(r.ceiling, ceiling(3, cpus, g_over_i));
    assert!(r.iothread_busy > 0.0 && r.round_speedups.0 > 0.0);
    // The process's CPU is read (the iothread's is read over a span of its own, so the two
    // are not compared: which one is larger depends on how the threads were scheduled).
    let c1 = &cells[0].result;
    assert!(c1.process_cpu_s > 0.0, "{c1:?}");
    assert!(r.ceiling_all_threads > 0.0 && r.ceiling_all_threads <= 3.0);
    assert_eq!(json["scaling"][0]["iothreads"], 3);
    assert_eq!(json["scaling"][0]["of_ceiling"], r.of_ceiling());
    let text = scaling_table(&spec, &rows);
    assert!(
        text.contains("of ceiling") && text.contains(&r.label),
        "{text}"
    );
    assert_eq!(scaling_table(&spec, &[]), "");
}
