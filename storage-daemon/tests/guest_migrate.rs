//! Live migration with a running Linux guest: a VM on our vhost-user-blk export moves to a
//! second QEMU on a second daemon of the same image and back, while the guest runs fio
//! `randwrite` with crc32c verify (verifying reads interleaved with the writes, `verify_backlog`)
//! on both queues, as QEMU 10.0 moves a VM between two qemu-storage-daemons
//! (storage-daemon/README.md, "Live migration").
//!
//! Each run: two daemons, both with a monitor, in qemu-storage-daemon's command-line form, the
//! source's nodes active, the destination's `active=off`, both exports `allow-inactive=on`;
//! the guest boots on QEMU `src` (TCG, its RAM a shared memfd as vhost-user needs), and once
//! fio runs it is migrated (capabilities `events` and `pause-before-switchover`) to QEMU `dst`
//! on the second daemon: at `pre-switchover` the test calls `blockdev-set-active
//! active=false` on the source daemon, `active=true` on the destination's, then
//! `migrate-continue`. Once a fio pass has ended on `dst`, the guest moves the same way to a
//! third QEMU, `back`, on the first daemon (the daemons' roles swapped). Once a pass has ended
//! there too, the test tells the guest to stop (a line on its serial console); it ends the
//! pass under way, checks its kernel log and powers off.
//!
//! `a_vm_on_an_nbd_export_migrates_with_a_running_guest_and_back`: the same with the daemons'
//! NBD exports (`--nbd-server`, `--export type=nbd,...,allow-inactive=on`) and each QEMU's NBD
//! client under a `virtio-blk-pci` device, the shape of QEMU's `tests/qsd-migrate`.
//!
//! A run passes when every fio pass exited 0 with its verify intact (a pass spans each
//! migration: what it wrote before is verified after), the guest's kernel logged no I/O
//! error, the daemons end as they should (the first active, the second not, both exiting 0 on
//! SIGTERM) and, for qcow2, `qemu-img check` finds the image clean. Each migration prints
//! QEMU's `query-migrate` `downtime` (the handover included) and the handover's own time; a
//! run prints the guest's longest gap between two completions (on the guest's clock, which
//! stops with the VM: a hiccup around the switchover, not the downtime). Nothing is timed
//! against a limit: the guest runs fio until told to stop, and every wait only bounds a hang.
//!
//! `a_destination_without_active_off_is_refused_by_the_locks`: with the guest writing through
//! the source daemon, a destination daemon opening the qcow2 image active exits 2 with QEMU's
//! `Failed to get "write" lock`; one opened `active=off` starts, but cannot be activated
//! while the source holds the image.
//!
//! `qemu_storage_daemon_migrates_the_same_guest` (ignored): the raw run with
//! qemu-storage-daemon as both daemons, its downtime printed beside ours (BENCHMARKS.md's
//! figure; not asserted). qemu-storage-daemon 10.0 cannot hand a vhost-user-blk export over
//! (`allow-inactive` there is "Export type does not support inactive exports"), so its two
//! daemons serve the raw image active throughout (its exports share write) and its
//! migrations pause at `pre-switchover` without a handover. On NBD exports both servers
//! hand the image over, so the NBD rounds compare like with like.
//!
//! Needs the guest of `vhost-user-blk/scripts/build-guest.sh` (built once into
//! `target/guest/`; its `/init` is replaced by `tests/guest/migrate-init.sh` for these runs),
//! `qemu-system-x86_64`, `qemu-img`, and for the RBD run a test cluster
//! (`AIO_CEPH_CONF`, or one `rbd/src/testing.rs` starts). Without the guest the tests print
//! `skipped: <reason>` and pass, unless `AIO_REQUIRE_ALL_BACKENDS=1`. One test:
//! `cargo test -p aio-storage-daemon --test guest_migrate -- --nocapture --test-threads 1
//! a_raw_image`.

mod common;
#[path = "guest/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "guest/migration.rs"]
mod migration;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aio_test_support::launch::LaunchError;
use harness::{guest_image, runnable, GuestRun, GuestSpec, GUEST_TIMEOUT};
use migration::{
    active_nodes, guest_run, migrate, migrate_initrd, qcow2_clean, serve, Export, Machine,
    Migrated, Role, Served, Vm, STOP_TIMEOUT,
};
use serde_json::json;

/// The guest's disk: 256 MiB.
const CAPACITY: u64 = 256 << 20;
/// Request queues, and vCPUs.
const QUEUES: u32 = 2;
/// The checks a migration run must pass, in the guest's order.
const CHECKS: &[&str] = &["vda", "size", "queues", "fio-migrate", "no-io-errors"];
/// Our daemon.
const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");
/// The export most runs use.
const VHOST: Export = Export::VhostUserBlk;

/// One guest at a time: each takes both CPUs under TCG.
static GUESTS: Mutex<()> = Mutex::new(());

/// A run's disk.
enum Disk {
    /// A raw file.
    Raw,
    /// A qcow2 image made by `qemu-img`, checked by it after the run.
    Qcow2,
    /// An RBD image in the test cluster: pool, image, the cluster's configuration.
    Rbd(String, String, PathBuf),
}

/// The disk's `--blockdev` options, the exported node last (made in `dir` for a file).
fn nodes(disk: &Disk, dir: &Path) -> (Vec<String>, Option<PathBuf>) {
    let file = |path: &Path| {
        format!(
            "driver=file,node-name=f,filename={},cache.direct=on",
            path.display()
        )
    };
    match disk {
        Disk::Raw => {
            let path = dir.join("disk.img");
            std::fs::File::create(&path)
                .and_then(|f| f.set_len(CAPACITY))
                .expect("create the image");
            (vec![file(&path)], None)
        }
        Disk::Qcow2 => {
            let path = dir.join("disk.qcow2");
            aio_test_support::tool::run(
                "qemu-img",
                &[
                    "create",
                    "-q",
                    "-f",
                    "qcow2",
                    path.to_str().expect("UTF-8"),
                    &CAPACITY.to_string(),
                ],
            );
            let qcow2 = "driver=qcow2,node-name=disk,file=f".to_string();
            (vec![file(&path), qcow2], Some(path))
        }
        Disk::Rbd(pool, image, conf) => {
            let node = format!(
                "driver=rbd,node-name=f,pool={pool},image={image},conf={},user=admin",
                conf.display()
            );
            (vec![node], None)
        }
    }
}

/// What the guest is told: its disk, and fio's shape.
fn append() -> String {
    format!(
        "console=ttyS0 panic=-1 aio.size={CAPACITY} aio.queues={QUEUES} aio.fio_size=24M \
         aio.iodepth=32"
    )
}

/// What one run did.
struct Outcome {
    /// The two migrations, there and back.
    migrations: Vec<Migrated>,
    /// The guest's run, over its three QEMUs.
    run: GuestRun,
    /// `qemu-img check` of a qcow2 image (None for another disk).
    image_check: Option<Result<String, String>>,
}

/// A daemon of `program` exporting `nodes` as `export` (panics with its output if it does
/// not start).
fn daemon(
    program: &str,
    label: &str,
    dir: &Path,
    nodes: &[String],
    export: Export,
    role: Role,
) -> Served {
    serve(program, label, dir, nodes, (export, QUEUES), role).unwrap_or_else(|e| panic!("{e}"))
}

/// Boots the guest on a daemon of `program` exporting `disk` as `export`, migrates it to a
/// second daemon and back, stops it; None (said) when the guest cannot be built. With
/// `shared` both daemons serve the image active throughout, and no handover is made
/// (qemu-storage-daemon's vhost-user-blk export).
fn migrate_run(
    name: &str,
    program: &str,
    (disk, export): (&Disk, Export),
    shared: bool,
) -> Option<Outcome> {
    let image = guest_image()?;
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let (nodes, qcow2) = nodes(disk, dir);
    let initrd = migrate_initrd(image, dir);
    let append = append();
    let machine = Machine {
        image,
        initrd: &initrd,
        append: &append,
        queues: QUEUES,
        dir,
    };
    let started = Instant::now();
    let (role_a, role_b) = match shared {
        false => (Role::Active, Role::Inactive),
        true => (Role::Shared, Role::Shared),
    };
    let mut a = daemon(program, "daemon-a", dir, &nodes, export, role_a);
    let mut b = daemon(program, "daemon-b", dir, &nodes, export, role_b);
    println!("{name}: {program} serving {nodes:?}");

    let mut src = Vm::start(&machine, "src", &a, false);
    let mut dst = Vm::start(&machine, "dst", &b, true);
    src.wait_for("GUEST-FIO-START", 1, GUEST_TIMEOUT);
    // Into the first pass (its writes are verified on the destination).
    std::thread::sleep(Duration::from_secs(2));
    let there = migrate(
        &mut src,
        &mut dst,
        (!shared).then_some((&mut a, &mut b)),
        dir,
    );
    let first = src.quit();
    dst.wait_for("GUEST-FIO-PASS", 1, GUEST_TIMEOUT);

    let mut back = Vm::start(&machine, "back", &a, true);
    let returned = migrate(
        &mut dst,
        &mut back,
        (!shared).then_some((&mut b, &mut a)),
        dir,
    );
    let second = dst.quit();
    back.wait_for("GUEST-FIO-PASS", 1, GUEST_TIMEOUT);
    back.say("stop");
    let (status, third) = back.wait_exit(STOP_TIMEOUT);

    let run = guest_run(
        &[first, second, third],
        status.is_none(),
        image.logs.join(format!("{name}.log")),
        started.elapsed(),
    );
    // The first daemon serves the disk again; the second let it go (shared: both kept it).
    let (on_a, on_b) = (active_nodes(&mut a.qmp), active_nodes(&mut b.qmp));
    assert!(on_a.iter().all(|(_, active)| *active), "daemon a: {on_a:?}");
    assert!(
        on_b.iter().all(|(_, active)| *active == shared),
        "daemon b: {on_b:?}"
    );
    for served in [a, b] {
        let label = served.daemon.label().to_string();
        let status = served.daemon.stop().unwrap_or_else(|e| panic!("{e}"));
        // qemu-storage-daemon's status after SIGTERM is its own affair.
        assert!(
            program != OURS || status.success(),
            "{label} exited with {status} after SIGTERM"
        );
    }
    let image_check = qcow2.map(|path| qcow2_clean(&path));
    let outcome = Outcome {
        migrations: vec![there, returned],
        run,
        image_check,
    };
    println!(
        "{name}: downtime {} ms there, {} ms back; the guest's longest completion gap {} ms; \
         {} fio passes; run {:.1} s",
        outcome.migrations[0].downtime_ms,
        outcome.migrations[1].downtime_ms,
        outcome.gap_ms().map_or("?".into(), |g| g.to_string()),
        outcome.run.info("passes").unwrap_or_else(|| "?".into()),
        outcome.run.elapsed.as_secs_f64()
    );
    Some(outcome)
}

/// What the checks are held to (the disk's identity is not asserted beyond its size and
/// queues: qemu-storage-daemon's export has no serial).
fn spec() -> GuestSpec<'static> {
    GuestSpec {
        socket: Path::new(""),
        capacity: CAPACITY,
        serial: None,
        queues: QUEUES,
        checks: CHECKS,
        append: String::new(),
        reconnect: false,
        monitor: None,
        nbd_export: None,
    }
}

impl Outcome {
    /// The guest's longest gap between two completions, in ms.
    fn gap_ms(&self) -> Option<u64> {
        self.run.info("max_completion_gap_ms")?.parse().ok()
    }

    /// Asserts the run passed: every check of the guest, a clean image.
    fn assert_passed(&self) {
        self.run.assert_passed(&spec());
        if let Some(check) = &self.image_check {
            match check {
                Ok(said) => println!("qemu-img check: {}", said.trim()),
                Err(e) => panic!("the qcow2 image after the run: {e}"),
            }
        }
    }
}

/// A raw file: there and back, the guest's verify intact.
#[test]
fn a_raw_image_migrates_with_a_running_guest_and_back() {
    if let Some(outcome) = migrate_run("migrate-raw", OURS, (&Disk::Raw, VHOST), false) {
        outcome.assert_passed();
    }
}

/// A qcow2 image (fio's first pass allocates its clusters on the source, its verify reads
/// them on the destination): there and back, the guest's verify intact, `qemu-img check`
/// clean.
#[test]
fn a_qcow2_image_migrates_with_a_running_guest_and_back() {
    if let Some(outcome) = migrate_run("migrate-qcow2", OURS, (&Disk::Qcow2, VHOST), false) {
        outcome.assert_passed();
    }
}

/// A VM whose disk is QEMU's NBD client of our NBD export (the shape of QEMU's
/// `tests/qsd-migrate`, with a running guest): a qcow2 image there and back, the guest's
/// verify intact, `qemu-img check` clean.
#[test]
fn a_vm_on_an_nbd_export_migrates_with_a_running_guest_and_back() {
    let disk = (&Disk::Qcow2, Export::Nbd);
    if let Some(outcome) = migrate_run("migrate-nbd-qcow2", OURS, disk, false) {
        outcome.assert_passed();
    }
}

/// An RBD image in the test cluster: the exclusive lock handed over with the image.
#[test]
fn an_rbd_image_migrates_with_a_running_guest_and_back() {
    use aio_rbd::testing::TestCluster;
    let Some(test) = TestCluster::get() else {
        return;
    };
    let spec = TestCluster::new_image(&test.connect(), "migrate", CAPACITY);
    let run_dir = tempfile::tempdir().expect("tempdir");
    // The daemons' lock records (one host: one directory).
    std::env::set_var("AIO_STORAGE_DAEMON_RUN_DIR", run_dir.path());
    let disk = Disk::Rbd(
        spec.pool.clone(),
        spec.image.clone(),
        test.conf().to_path_buf(),
    );
    if let Some(outcome) = migrate_run("migrate-rbd", OURS, (&disk, VHOST), false) {
        outcome.assert_passed();
    }
}

/// With the guest writing through the source daemon, the destination daemon started without
/// `active=off` on the qcow2 image is refused by the image's locks: it exits 2 with QEMU's
/// text. Started `active=off` it runs, and activating it is refused the same way while the
/// source holds the image. The source's guest goes on unharmed.
#[test]
fn a_destination_without_active_off_is_refused_by_the_locks() {
    let Some(image) = guest_image() else { return };
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let (nodes, qcow2) = nodes(&Disk::Qcow2, dir);
    let initrd = migrate_initrd(image, dir);
    let append = append();
    let machine = Machine {
        image,
        initrd: &initrd,
        append: &append,
        queues: QUEUES,
        dir,
    };
    let started = Instant::now();
    let a = daemon(OURS, "daemon-a", dir, &nodes, VHOST, Role::Active);
    let mut src = Vm::start(&machine, "src", &a, false);
    src.wait_for("GUEST-FIO-START", 1, GUEST_TIMEOUT);

    match serve(OURS, "daemon-b", dir, &nodes, (VHOST, QUEUES), Role::Active) {
        Ok(_) => panic!("a second daemon opened the image active while the first serves it"),
        Err(e @ LaunchError::Failed { .. }) => {
            let text = e.to_string();
            println!("the destination without active=off: {text}");
            assert!(text.contains("exited (exit status: 2)"), "{text}");
            assert!(text.contains("Failed to get \"write\" lock"), "{text}");
        }
        Err(e) => panic!("{e}"),
    }
    let mut b = daemon(OURS, "daemon-b", dir, &nodes, VHOST, Role::Inactive);
    let (_, desc) = b.qmp.error("blockdev-set-active", json!({"active": true}));
    assert!(desc.contains("Failed to get \"write\" lock"), "{desc}");
    assert!(active_nodes(&mut b.qmp).iter().all(|(_, active)| !*active));
    b.daemon.stop().unwrap_or_else(|e| panic!("{e}"));

    src.wait_for("GUEST-FIO-PASS", 1, GUEST_TIMEOUT);
    src.say("stop");
    let (status, console) = src.wait_exit(STOP_TIMEOUT);
    let run = guest_run(
        &[console],
        status.is_none(),
        image.logs.join("migrate-refused.log"),
        started.elapsed(),
    );
    run.assert_passed(&spec());
    assert!(a.daemon.stop().unwrap_or_else(|e| panic!("{e}")).success());
    let path = qcow2.expect("a qcow2 image");
    let said = qcow2_clean(&path).unwrap_or_else(|e| panic!("{e}"));
    println!("qemu-img check: {}", said.trim());
}

/// The raw run with qemu-storage-daemon as both daemons, then with ours, on each export:
/// vhost-user-blk (qemu-storage-daemon's daemons both active throughout, no handover: see the
/// file's header) and NBD (both hand the image over at `pre-switchover`), each
/// `AIO_MIGRATE_ROUNDS` times (3): every downtime printed, and each server's median (a
/// comparison, not asserted; the guest's checks are asserted for ours only, reported for
/// qemu-storage-daemon).
#[test]
#[ignore = "reference run against qemu-storage-daemon; run with --ignored"]
fn qemu_storage_daemon_migrates_the_same_guest() {
    if !runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let rounds: usize = std::env::var("AIO_MIGRATE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    // Who, the program, the export, whether both daemons stay active (no handover).
    let servers = [
        ("qemu-storage-daemon", "qemu-storage-daemon", VHOST, true),
        ("aio-storage-daemon", OURS, VHOST, false),
        (
            "qemu-storage-daemon",
            "qemu-storage-daemon",
            Export::Nbd,
            false,
        ),
        ("aio-storage-daemon", OURS, Export::Nbd, false),
    ];
    let mut downtimes: Vec<Vec<u64>> = vec![Vec::new(); servers.len()];
    let mut failed = vec![0; servers.len()];
    for round in 0..rounds {
        for (n, (who, program, export, shared)) in servers.iter().enumerate() {
            let name = format!("migrate-raw-{who}-{export:?}-{round}");
            let Some(o) = migrate_run(&name, program, (&Disk::Raw, *export), *shared) else {
                return;
            };
            downtimes[n].extend(o.migrations.iter().map(|m| m.downtime_ms));
            if *program == OURS {
                o.assert_passed();
            } else if std::panic::catch_unwind(|| o.run.assert_passed(&spec())).is_err() {
                failed[n] += 1;
            }
        }
    }
    println!("\nmigration downtime (ms; QEMU's query-migrate, there and back, {rounds} rounds):");
    for (n, (who, _, export, shared)) in servers.iter().enumerate() {
        let mut all = downtimes[n].clone();
        all.sort_unstable();
        println!(
            "  {who} ({export:?}): median {} of {:?}{}; {} guest runs failed",
            all[all.len() / 2],
            downtimes[n],
            if *shared {
                " (no handover)"
            } else {
                " (the handover included)"
            },
            failed[n]
        );
    }
}
