//! The daemon killed and restarted under a running Linux guest (QEMU reconnecting with
//! `reconnect-ms=500`), as an operator's crash or upgrade would: fio `randwrite` with crc32c
//! verify on both queues keeps running, nothing is lost, nothing hangs.
//!
//! Each run boots the guest of `scripts/build-guest.sh` in its restart mode and stops the
//! daemon at random moments (the seed is printed; `AIO_RESTART_SEED=N` repeats a run):
//!
//! * once right after QEMU starts, before the guest's driver has probed the disk;
//! * once while the guest is idle (the disk set up, no request in flight);
//! * at least three times while fio runs (SIGKILL: a crash, the requests in flight left in the
//!   in-flight region; SIGTERM: an upgrade, the requests completed first), each time started
//!   again on the same socket, with the same or another `--engine`.
//!
//! A run passes when fio exits 0 with its verify intact, the guest's kernel logs no I/O error,
//! and no completion gap is longer than the longest downtime plus a margin (no hang). The
//! guest's longest gap between two completions (from fio's per-request log) is its view of
//! the downtime; every run prints it.
//!
//! The soak (ignored; at least 50 kills per engine, and the same kills against
//! qemu-storage-daemon, reported beside ours):
//! `cargo test --release -p aio-storage-daemon --test guest_restart -- --ignored --nocapture`.

mod common;
#[path = "guest/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "guest/restarts.rs"]
mod restarts;

use std::path::Path;
use std::process::Command;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use harness::{guest_image, run_guest, runnable, GuestRun, GuestSpec};
use restarts::{start, stopping, Moment, Server, Stop, StopperArgs};

/// The guest's disk: 256 MiB.
const CAPACITY: u64 = 256 << 20;
/// Request queues, and vCPUs.
const QUEUES: u32 = 2;
/// The checks a restart run must pass.
const RESTART_CHECKS: &[&str] = &[
    "vda",
    "size",
    "serial",
    "queues",
    "fio-restart",
    "no-io-errors",
];
/// The serial of our daemon's disk.
const SERIAL: &str = "aio-restart";
/// The longest a completion gap may exceed the longest downtime by before the run counts as
/// hung: far above any pause a slow machine makes, far below the guest's fio timeout.
const GAP_MARGIN: Duration = Duration::from_secs(30);

/// One guest at a time: each takes both CPUs under TCG.
static GUESTS: Mutex<()> = Mutex::new(());

/// One run's plan.
struct Plan<'a> {
    server: Server,
    /// The engine of each start, in turn (ours only).
    engines: &'a [&'a str],
    stop: Stop,
    /// Stops while fio runs.
    fio_stops: usize,
    /// fio's passes over each job's region (long enough for the stops).
    loops: u32,
    /// What the disk is.
    disk: Disk,
}

/// A run's disk.
#[derive(Debug, Clone)]
enum Disk {
    /// A raw file.
    Raw,
    /// A qcow2 image, made by `qemu-img` and checked by it after the run.
    Qcow2,
    /// An RBD image, by its `rbd:` name (made by the test, in its cluster).
    Rbd(String),
}

/// What one run did.
struct Outcome {
    /// Stops made (all kinds).
    stops: usize,
    /// Stops made while fio ran.
    fio_stops: usize,
    /// The longest time between a stop and the new daemon's socket.
    longest_downtime: Duration,
    /// The guest's longest gap between two completions, in ms.
    max_gap_ms: Option<u64>,
    /// Requests our restarted daemons ran again from the in-flight region (their logs).
    resubmitted: u64,
    /// Every daemon's log, for a failed run.
    logs: String,
    /// What `qemu-img check` found wrong with a qcow2 disk after the run (None: nothing, or
    /// only leaked clusters; always None for a raw disk).
    image_check: Option<String>,
    /// The guest run.
    run: GuestRun,
}

fn seed() -> u64 {
    std::env::var("AIO_RESTART_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            t.map_or(1, |d| d.as_nanos() as u64) | 1
        })
}

/// Boots the guest against `plan.server` and stops and restarts the daemon as planned.
fn restart_run(name: &str, plan: &Plan, seed: u64) -> Option<Outcome> {
    let image = guest_image()?;
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = if let Disk::Rbd(name) = &plan.disk {
        std::path::PathBuf::from(name)
    } else if let Disk::Qcow2 = plan.disk {
        let disk = dir.path().join("disk.qcow2");
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg(CAPACITY.to_string())
            .status()
            .expect("qemu-img (install qemu-utils)");
        assert!(made.success(), "qemu-img create");
        disk
    } else {
        let disk = dir.path().join("disk.img");
        std::fs::File::create(&disk)
            .and_then(|f| f.set_len(CAPACITY))
            .expect("create the image");
        disk
    };
    let socket = dir.path().join("vhost-user-blk.sock");
    let monitor = dir.path().join("monitor.sock");
    let engine = |n: usize| plan.engines[n % plan.engines.len()];
    let first = start(plan.server, engine(0), dir.path(), &socket, &disk, 0);
    println!(
        "{name}: seed {seed}, {:?} with {:?}",
        plan.server, plan.stop
    );

    let (tx, rx) = mpsc::channel::<Moment>();
    let stopper = {
        let (dir, socket, disk) = (dir.path().to_path_buf(), socket.clone(), disk.clone());
        let (server, stop, fio_stops) = (plan.server, plan.stop, plan.fio_stops);
        let engines: Vec<String> = plan.engines.iter().map(|e| e.to_string()).collect();
        let label = name.to_string();
        let monitor = monitor.clone();
        std::thread::spawn(move || {
            stopping(StopperArgs {
                label,
                monitor,
                rx,
                first,
                server,
                stop,
                fio_stops,
                engines,
                dir,
                socket,
                disk,
                seed,
            })
        })
    };
    let spec = GuestSpec {
        socket: &socket,
        capacity: CAPACITY,
        serial: matches!(plan.server, Server::Ours).then_some(SERIAL),
        queues: QUEUES,
        checks: RESTART_CHECKS,
        append: format!(
            "aio.mode=restart aio.iodepth=32 aio.fio_size=24M aio.loops={} aio.idle=4 \
             aio.fio_timeout=300",
            plan.loops
        ),
        reconnect: true,
        monitor: Some(monitor.clone()),
        nbd_export: None,
    };
    let mut booted = false;
    let run = run_guest(image, &spec, name, &mut |line| {
        let moment = if !booted {
            booted = true;
            Some(Moment::Boot)
        } else if line.contains("GUEST-IDLE-START") {
            Some(Moment::Idle)
        } else if line.contains("GUEST-FIO-START") {
            Some(Moment::Fio)
        } else if line.contains("GUEST-CHECK fio-restart") {
            Some(Moment::End)
        } else if line.contains("GUEST-HUNG") {
            Some(Moment::Hung)
        } else {
            None
        };
        if let Some(m) = moment {
            let _ = tx.send(m);
        }
    });
    drop(tx);
    let (stops, fio_stops, longest_downtime) = stopper.join().expect("the stopping thread");
    let max_gap_ms = run
        .info("max_completion_gap_ms")
        .and_then(|v| v.parse().ok());
    let (logs, resubmitted) = daemon_logs(dir.path());
    let image_check = matches!(plan.disk, Disk::Qcow2)
        .then(|| qcow2_check(&disk))
        .flatten();
    println!(
        "{name}: {stops} stops ({fio_stops} during fio), longest downtime {:.2} s, guest's \
         longest completion gap {max_gap_ms:?} ms, {resubmitted} requests resubmitted, run \
         {:.1} s",
        longest_downtime.as_secs_f64(),
        run.elapsed.as_secs_f64()
    );
    Some(Outcome {
        stops,
        fio_stops,
        longest_downtime,
        max_gap_ms,
        resubmitted,
        logs,
        image_check,
        run,
    })
}

/// `qemu-img check` of a qcow2 image after the last daemon stopped: None when it finds at most
/// leaked clusters (exit 0 or 3: a kill may leak what it was allocating), else what it said.
fn qcow2_check(disk: &Path) -> Option<String> {
    let out = Command::new("qemu-img")
        .arg("check")
        .arg(disk)
        .output()
        .expect("qemu-img check");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "qemu-img check {}: exit {:?}\n{said}",
        disk.display(),
        out.status.code()
    );
    match out.status.code() {
        Some(0) | Some(3) => None,
        code => Some(format!("qemu-img check exit {code:?}: {said}")),
    }
}

/// Every daemon's log in `dir`, in the order they started (what a failed run shows), and the
/// requests they say they resubmitted (`resubmitting N requests`).
fn daemon_logs(dir: &Path) -> (String, u64) {
    let (mut all, mut resubmitted) = (String::new(), 0);
    for n in 0.. {
        let path = dir.join(format!("daemon-{n}.log"));
        let Ok(log) = std::fs::read_to_string(&path) else {
            break;
        };
        for line in log.lines() {
            all.push_str(&format!("[daemon {n}] {line}\n"));
            let mut words = line.split_whitespace();
            if words.any(|w| w == "resubmitting") {
                let count = words.next().and_then(|c| c.parse::<u64>().ok());
                resubmitted += count.unwrap_or(0);
            }
        }
    }
    (all, resubmitted)
}

impl Outcome {
    /// Asserts the run passed: every check, every stop made, no gap that is a hang.
    fn assert_passed(&self, plan: &Plan) {
        let spec_checks = GuestSpec {
            socket: Path::new(""),
            capacity: CAPACITY,
            serial: Some(SERIAL),
            queues: QUEUES,
            checks: RESTART_CHECKS,
            append: String::new(),
            reconnect: true,
            monitor: None,
            nbd_export: None,
        };
        if !self.passed() {
            println!("the daemons' logs:\n{}", self.logs);
        }
        self.run.assert_passed(&spec_checks);
        assert_eq!(self.image_check, None, "the qcow2 image after the run");
        assert_eq!(
            self.fio_stops, plan.fio_stops,
            "fio ended before every stop was made ({} of {}): raise its loops",
            self.fio_stops, plan.fio_stops
        );
        let gap = Duration::from_millis(self.max_gap_ms.expect("the guest reports its gap"));
        assert!(
            gap <= self.longest_downtime + GAP_MARGIN,
            "the guest waited {gap:?} for a completion; the longest downtime was {:?}",
            self.longest_downtime
        );
    }

    /// Whether the guest's checks all passed (for the soak's report).
    fn passed(&self) -> bool {
        self.image_check.is_none()
            && self.run.done
            && !self.run.timed_out
            && RESTART_CHECKS.iter().all(|name| {
                self.run
                    .checks
                    .iter()
                    .any(|c| c.name == *name && (c.passed || *name == "serial"))
            })
    }
}

/// SIGKILL at boot, while idle and three times during fio, restarted with the same engine:
/// every engine the kernel offers.
#[test]
fn the_guest_survives_sigkill_of_the_daemon_with_every_engine() {
    for engine in common::engines() {
        let plan = Plan {
            server: Server::Ours,
            engines: &[engine],
            stop: Stop::Kill,
            fio_stops: 3,
            loops: 4,
            disk: Disk::Raw,
        };
        let name = format!("restart-kill-{engine}");
        let Some(outcome) = restart_run(&name, &plan, seed()) else {
            return;
        };
        outcome.assert_passed(&plan);
    }
}

/// SIGKILL at boot, while idle and three times during fio on a qcow2 image (fio's first pass
/// allocates its clusters), each restart with the next engine: the guest's verify passes, and
/// `qemu-img check` afterwards finds at most leaked clusters.
#[test]
fn the_guest_survives_sigkill_of_the_daemon_on_a_qcow2_image() {
    let engines = common::engines();
    let plan = Plan {
        server: Server::Ours,
        engines: &engines,
        stop: Stop::Kill,
        fio_stops: 3,
        loops: 4,
        disk: Disk::Qcow2,
    };
    let Some(outcome) = restart_run("restart-kill-qcow2", &plan, seed()) else {
        return;
    };
    outcome.assert_passed(&plan);
}

/// A new RBD image of the guest's capacity in the test cluster, by its `rbd:` name; None
/// (said) without a cluster.
fn rbd_disk() -> Option<(std::sync::Arc<aio_rbd::testing::TestCluster>, String)> {
    use aio_rbd::testing::TestCluster;
    let test = TestCluster::get()?;
    let spec = TestCluster::new_image(&test.connect(), "restart", CAPACITY);
    let name = test.qemu_name(&spec);
    Some((test, name))
}

/// SIGKILL at boot, while idle and three times during fio on an RBD disk: each restarted
/// daemon breaks its dead predecessor's exclusive lock (blocklisting it, so none of its
/// writes still in flight can land later) and runs the guest's requests again; the guest's
/// verify passes.
#[test]
fn the_guest_survives_sigkill_of_the_daemon_on_an_rbd_disk() {
    let Some((_cluster, name)) = rbd_disk() else {
        return;
    };
    let engines = common::engines();
    let plan = Plan {
        server: Server::Ours,
        engines: &engines,
        stop: Stop::Kill,
        fio_stops: 3,
        loops: 4,
        disk: Disk::Rbd(name),
    };
    let Some(outcome) = restart_run("restart-kill-rbd", &plan, seed()) else {
        return;
    };
    outcome.assert_passed(&plan);
}

/// SIGTERM (an upgrade) at boot, while idle and three times during fio, each restart with the
/// next engine.
#[test]
fn the_guest_survives_upgrades_to_another_engine() {
    let engines = common::engines();
    let plan = Plan {
        server: Server::Ours,
        engines: &engines,
        stop: Stop::Term,
        fio_stops: 3,
        loops: 4,
        disk: Disk::Raw,
    };
    let Some(outcome) = restart_run("restart-term", &plan, seed()) else {
        return;
    };
    outcome.assert_passed(&plan);
}

/// The soak: runs of ten SIGKILLs during fio until `AIO_SOAK_KILLS` (50) per engine, then on
/// an RBD disk (io_uring's fd monitor; the test cluster), then the same against
/// qemu-storage-daemon (threads and native AIO), reported and not asserted.
/// `AIO_SOAK_ONLY=pool,native` keeps the servers whose label names one of the words
/// (`AIO_SOAK_ONLY=rbd AIO_SOAK_KILLS=30`: the RBD disk's 30 kills alone).
#[test]
#[ignore = "soak: minutes per engine; run with --ignored"]
fn soak_sigkill_per_engine_and_against_qemu_storage_daemon() {
    let want: usize = std::env::var("AIO_SOAK_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let mut servers: Vec<(String, Server, &str, bool)> = common::engines()
        .into_iter()
        .map(|e| {
            (
                format!("aio-storage-daemon --engine {e}"),
                Server::Ours,
                e,
                false,
            )
        })
        .collect();
    servers.push(("aio-storage-daemon rbd".into(), Server::Ours, "uring", true));
    if runnable("qemu-storage-daemon") {
        for native in [false, true] {
            let name = format!(
                "qemu-storage-daemon aio={}",
                ["threads", "native"][native as usize]
            );
            servers.push((name, Server::Qsd { native }, "-", false));
        }
    }
    // AIO_SOAK_ONLY=pool,native: only the servers whose label contains one of these words.
    if let Ok(only) = std::env::var("AIO_SOAK_ONLY") {
        let words: Vec<&str> = only.split(',').filter(|w| !w.is_empty()).collect();
        servers.retain(|(label, _, _, _)| words.iter().any(|w| label.contains(w)));
    }
    let mut report = Vec::new();
    for (label, server, engine, rbd) in servers {
        let cluster = match rbd {
            true => match rbd_disk() {
                Some(made) => Some(made),
                None => continue,
            },
            false => None,
        };
        let (mut made, mut survived, mut runs, mut failed, mut resubmitted) = (0, 0, 0, 0, 0);
        let mut gaps = Vec::new();
        while made < want {
            let plan = Plan {
                server,
                engines: &[engine],
                stop: Stop::Kill,
                fio_stops: 10,
                loops: 12,
                disk: cluster
                    .as_ref()
                    .map_or(Disk::Raw, |(_, name)| Disk::Rbd(name.clone())),
            };
            let name = format!("soak-{}-{runs}", label.replace([' ', '='], "-"));
            let Some(outcome) = restart_run(&name, &plan, seed()) else {
                return;
            };
            runs += 1;
            made += outcome.stops;
            if outcome.passed() {
                survived += outcome.stops;
            } else {
                failed += 1;
                println!("{name} FAILED: console in {}", outcome.run.log.display());
                println!("{name}: the daemons' logs:\n{}", outcome.logs);
            }
            gaps.extend(outcome.max_gap_ms);
            resubmitted += outcome.resubmitted;
        }
        let max_gap = gaps.iter().max().copied().unwrap_or(0);
        let line = format!(
            "{label}: {survived}/{made} kills survived in {runs} runs ({failed} failed); \
             longest completion gap {max_gap} ms; {resubmitted} requests resubmitted"
        );
        println!("{line}");
        report.push((server, line, survived == made));
    }
    println!("\nsoak report:");
    for (_, line, _) in &report {
        println!("  {line}");
    }
    for (server, line, ok) in report {
        if server == Server::Ours {
            assert!(ok, "{line}");
        }
    }
}
