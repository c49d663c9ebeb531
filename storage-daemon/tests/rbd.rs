//! The daemon serving RBD images from a one-node Ceph cluster (`scripts/ceph-cluster.sh`, or
//! the one `AIO_CEPH_CONF` names): our `--disk image=rbd:...` form to libblkio,
//! qemu-storage-daemon's `--blockdev driver=rbd` over NBD to `qemu-io`, QMP `blockdev-add` and
//! `block_resize`; one writer (a second daemon refused with exit 2 naming the holder; a
//! SIGKILLed daemon's restart takes its lock back at once); and the start-up failures (an
//! unreachable cluster, a wrong key, a missing image or pool) as exit 2 naming the cause.

mod common;
#[path = "common/qmp.rs"]
mod qmp;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aio_rbd::testing::TestCluster;
use aio_rbd::{Cluster, ImageSpec, RbdImage};
use common::{daemon_refused, Daemon};
use qmp::Qmp;
use serde_json::json;

const MIB: u64 = 1 << 20;

/// `len` bytes at `offset` of the image, read by a client of our own (read-only: no lock).
fn read_back(cluster: &Arc<Cluster>, spec: &ImageSpec, offset: u64, len: usize) -> Vec<u8> {
    let image = RbdImage::open(cluster, spec, true).unwrap();
    let mut buf = vec![0u8; len];
    assert_eq!(image.read_at(offset, &mut buf).unwrap(), len);
    buf
}

fn disk_args(dir: &Path, name: &str, image: &str) -> (Vec<String>, std::path::PathBuf) {
    let socket = dir.join(format!("{name}.sock"));
    let args = vec![
        "--disk".to_string(),
        format!("socket={},image={image}", socket.display()),
        "--engine".to_string(),
        "pool".to_string(),
    ];
    (args, socket)
}

#[test]
fn the_daemon_serves_rbd_images() {
    let Some(test) = TestCluster::get() else {
        return;
    };
    // Every daemon of this test keeps its lock records here.
    let run_dir = tempfile::tempdir().unwrap();
    std::env::set_var("AIO_STORAGE_DAEMON_RUN_DIR", run_dir.path());
    let cluster = test.connect();
    our_disk_form_one_writer_and_a_restart_after_sigkill(&test, &cluster);
    qsd_blockdev_over_nbd_and_qmp(&test, &cluster);
    a_qcow2_image_in_rbd(&test);
    start_up_failures_exit_2_naming_the_cause(&test, &cluster);
    requests_wait_out_an_osd_and_a_monitor_restart(&test, &cluster);
}

fn our_disk_form_one_writer_and_a_restart_after_sigkill(
    test: &TestCluster,
    cluster: &Arc<Cluster>,
) {
    let dir = tempfile::tempdir().unwrap();
    let spec = TestCluster::new_image(cluster, "daemon", 64 * MIB);
    let image = test.qemu_name(&spec);
    let (args, socket) = disk_args(dir.path(), "a", &image);
    let daemon = Daemon::start(&args, vec![socket.clone()]);
    let mut c = common::connect(&socket, 1, 1 << 20).unwrap();
    assert_eq!(c.capacity().unwrap(), 64 * MIB);
    c.fill_buf(0, 65536, 0x5a);
    c.write(0, 4 * MIB, 0, 65536, 1);
    assert_eq!(c.wait(0, 1), [(1, 0)]);
    assert_eq!(c.sync(0, |q| q.flush(2, blkio::ReqFlags::empty())), 0);
    assert!(read_back(cluster, &spec, 4 * MIB, 65536)
        .iter()
        .all(|&b| b == 0x5a));

    // A second daemon on the image is refused, naming the image and the holder.
    let (second, _) = disk_args(dir.path(), "b", &image);
    let (code, stderr) = daemon_refused(&second, Duration::from_secs(30));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&spec.to_string()) && stderr.contains("locked by"),
        "{stderr}"
    );

    // SIGKILL with the lock held; the restarted daemon takes it back at once and serves.
    drop(c);
    daemon.stop_with(nix::sys::signal::Signal::SIGKILL);
    let started = Instant::now();
    let mut daemon = Daemon::start(&args, vec![socket.clone()]);
    let took = started.elapsed();
    let mut c = common::connect(&socket, 1, 1 << 20).unwrap();
    c.read(0, 4 * MIB, 0, 65536, 3);
    assert_eq!(c.wait(0, 1), [(3, 0)]);
    assert!(c.read_buf(0, 65536).iter().all(|&b| b == 0x5a));
    assert!(
        daemon.log().contains("took over the exclusive lock"),
        "{}",
        daemon.log()
    );
    eprintln!("restart after SIGKILL served in {took:?}");
    drop(c);
    let status = daemon.terminate();
    assert!(status.success(), "{status:?}");
    // Released on a clean stop: the next writer takes the lock without breaking anything.
    let image = RbdImage::open(cluster, &spec, false).unwrap();
    assert_eq!(image.lock_owners().unwrap(), Vec::<String>::new());
}

fn qsd_blockdev_over_nbd_and_qmp(test: &TestCluster, cluster: &Arc<Cluster>) {
    let dir = tempfile::tempdir().unwrap();
    let spec = TestCluster::new_image(cluster, "daemon", 32 * MIB);
    let spec2 = TestCluster::new_image(cluster, "daemon", 16 * MIB);
    let (nbd, monitor) = (dir.path().join("nbd.sock"), dir.path().join("qmp.sock"));
    let args = vec![
        "--blockdev".to_string(),
        format!(
            "driver=rbd,node-name=r0,pool=rbd,image={},conf={},user=admin",
            spec.image,
            test.conf().display()
        ),
        "--nbd-server".to_string(),
        format!("addr.type=unix,addr.path={}", nbd.display()),
        "--export".to_string(),
        "type=nbd,id=e0,node-name=r0,writable=on".to_string(),
        "--chardev".to_string(),
        format!("socket,id=m0,path={},server=on,wait=off", monitor.display()),
        "--monitor".to_string(),
        "chardev=m0".to_string(),
    ];
    let daemon = Daemon::start(&args, vec![nbd.clone(), monitor.clone()]);
    let url = format!("nbd+unix:///r0?socket={}", nbd.display());
    let out = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            &url,
            "-c",
            "write -P 0x6b 8M 128k",
            "-c",
            "read -P 0x6b 8M 128k",
        ])
        .output()
        .expect("qemu-io (qemu-utils)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("Pattern verification failed"),
        "{text}"
    );
    assert!(read_back(cluster, &spec, 8 * MIB, 131072)
        .iter()
        .all(|&b| b == 0x6b));
    // Block status over NBD (librbd's object map through our export) is what QEMU's own rbd
    // driver reports for the image.
    let map = |name: &str| {
        let out = Command::new("qemu-img")
            .args(["map", "--output=json", "-f", "raw", name])
            .output()
            .expect("qemu-img");
        assert!(out.status.success(), "qemu-img map {name}: {out:?}");
        let extents: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        extents
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["start"].as_u64(),
                    e["length"].as_u64(),
                    e["data"].as_bool(),
                )
            })
            .collect::<Vec<_>>()
    };
    let direct = test.qemu_name(&spec);
    let (ours, qemus) = (map(&url), map(&direct));
    assert_eq!(
        ours, qemus,
        "qemu-img map over our NBD export and of the RBD image"
    );
    assert!(
        ours.contains(&(Some(8 * MIB), Some(4 * MIB), Some(true))),
        "{ours:?}"
    );

    // QMP: an RBD node reached by its monitor list (JSON `server`), exported, resized.
    let (mut q, _) = Qmp::connect(&monitor, false);
    q.ok(
        "blockdev-add",
        json!({"driver": "rbd", "node-name": "r1", "pool": "rbd", "image": spec2.image,
               "conf": test.conf(), "user": "admin",
               "server": [{"host": "127.0.0.1", "port": "6789"}]}),
    );
    let vhost = dir.path().join("r1.sock");
    q.ok(
        "block-export-add",
        json!({"type": "vhost-user-blk", "id": "e1", "node-name": "r1", "writable": true,
               "addr": {"type": "unix", "path": vhost}}),
    );
    qmp::disk_works(&vhost);
    q.ok("block_resize", json!({"node-name": "r1", "size": 48 * MIB}));
    let image = RbdImage::open(cluster, &spec2, true).unwrap();
    assert_eq!(image.size().unwrap(), 48 * MIB);
    let c = common::connect(&vhost, 1, 4096).unwrap();
    assert_eq!(
        c.capacity().unwrap(),
        48 * MIB,
        "a new frontend sees the new size"
    );
    drop(c);
    drop(q);
    assert!(daemon.terminate().success());
}

fn start_up_failures_exit_2_naming_the_cause(test: &TestCluster, cluster: &Arc<Cluster>) {
    let dir = tempfile::tempdir().unwrap();
    let conf = test.conf().display().to_string();
    let cases = [
        (format!("rbd:rbd/no-such-image:conf={conf}"), "no RBD image rbd/no-such-image"),
        (format!("rbd:no-such-pool/x:conf={conf}"), "no Ceph pool \"no-such-pool\""),
        (
            format!("rbd:rbd/x:conf={conf}:key=AQBsgvVlAAAAABAAOUdm0rS1GZR6+JZhqyr6FA==:keyring=/nonexistent"),
            "refused the key of client.admin",
        ),
        (
            "rbd:rbd/x:mon_host=127.0.0.1\\:1:key=AQBsgvVlAAAAABAAOUdm0rS1GZR6+JZhqyr6FA==:client_mount_timeout=3"
                .to_string(),
            "unreachable: no answer from the monitors 127.0.0.1:1",
        ),
    ];
    for (image, expected) in cases {
        let (args, _) = disk_args(dir.path(), "f", &image);
        let (code, stderr) = daemon_refused(&args, Duration::from_secs(60));
        assert_eq!(code, 2, "{image}: {stderr}");
        assert!(stderr.contains(expected), "{image}: {stderr}");
    }
    let _ = cluster;
}

/// A writer keeps 16 writes of 64 KiB in flight through the daemon while the OSD is SIGKILLed
/// and started again, then the monitor: every write ends once and succeeds, and the image
/// holds the last pattern written to each block.
fn requests_wait_out_an_osd_and_a_monitor_restart(test: &TestCluster, cluster: &Arc<Cluster>) {
    const BLOCK: usize = 64 << 10;
    const BLOCKS: u64 = 256;
    let dir = tempfile::tempdir().unwrap();
    let spec = TestCluster::new_image(cluster, "daemon", BLOCKS * BLOCK as u64);
    let image = test.qemu_name(&spec);
    let (args, socket) = disk_args(dir.path(), "fault", &image);
    let daemon = Daemon::start(&args, vec![socket.clone()]);
    let mut c = common::connect(&socket, 1, 16 * BLOCK).unwrap();
    let faults_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let faults = {
        let (conf, done) = (test.conf().to_path_buf(), faults_done.clone());
        std::thread::spawn(move || {
            let test = TestCluster::at(&conf);
            for daemon in ["osd.0", "mon.a"] {
                std::thread::sleep(Duration::from_millis(500));
                test.kill(daemon);
                std::thread::sleep(Duration::from_secs(2));
                test.revive(daemon);
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    let mut model = vec![0u8; BLOCKS as usize];
    let (mut round, mut tag, mut ended) = (0u64, 0usize, 0usize);
    let started = Instant::now();
    while !faults_done.load(std::sync::atomic::Ordering::Acquire) || round < 4 {
        let byte = (round % 250) as u8 + 1;
        let mut tags = std::collections::BTreeSet::new();
        for slot in 0..16u64 {
            let block = (round * 37 + slot * 16) % BLOCKS;
            c.fill_buf(slot as usize * BLOCK, BLOCK, byte);
            c.write(0, block * BLOCK as u64, slot as usize * BLOCK, BLOCK, tag);
            tags.insert(tag);
            model[block as usize] = byte;
            tag += 1;
        }
        // An OSD's restart takes seconds, more on a loaded machine: each completion may take
        // up to 2 minutes (requests wait; they do not fail).
        let ended_now = c.wait_for(0, 16, Duration::from_secs(120)).unwrap();
        assert_eq!(ended_now.len(), 16, "a write did not end within 2 minutes");
        for (t, ret) in ended_now {
            assert_eq!(ret, 0, "write {t} failed");
            assert!(
                tags.remove(&t),
                "write {t} ended twice, or was never submitted"
            );
            ended += 1;
        }
        round += 1;
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "writes stalled"
        );
    }
    faults.join().unwrap();
    assert_eq!(ended, tag, "every write ended once");
    drop(c);
    assert!(daemon.terminate().success());
    let image = RbdImage::open(cluster, &spec, true).unwrap();
    let mut buf = vec![0u8; BLOCK];
    for (block, &byte) in model.iter().enumerate() {
        image
            .read_at(block as u64 * BLOCK as u64, &mut buf)
            .unwrap();
        assert!(
            buf.iter().all(|&b| b == byte),
            "block {block}: expected {byte:#x}"
        );
    }
    eprintln!("{round} rounds of 16 writes across an OSD and a monitor restart");
}

/// A qcow2 image imported into RBD, served by `--disk image=rbd:...` (found by its header),
/// written through libblkio; exported back to a file, `qemu-img check` finds it clean and
/// `qemu-io` reads the writes.
fn a_qcow2_image_in_rbd(test: &TestCluster) {
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("out.qcow2");
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).output().unwrap();
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let spec = ImageSpec::new("rbd", &TestCluster::unique_name("qcow2"));
    test.import_new_qcow2(&spec, "64M");
    let image = test.qemu_name(&spec);
    let (args, socket) = disk_args(dir.path(), "q", &image);
    let daemon = Daemon::start(&args, vec![socket.clone()]);
    let mut c = common::connect(&socket, 1, 1 << 20).unwrap();
    assert_eq!(c.capacity().unwrap(), 64 * MIB);
    c.fill_buf(0, 65536, 0x7e);
    c.write(0, 16 * MIB, 0, 65536, 1);
    assert_eq!(c.wait(0, 1), [(1, 0)]);
    drop(c);
    assert!(daemon.terminate().success());
    test.rbd(&["export", &spec.to_string(), back.to_str().unwrap()]);
    run("qemu-img", &["check", "-q", back.to_str().unwrap()]);
    let read = run(
        "qemu-io",
        &["-c", "read -P 0x7e 16M 64k", back.to_str().unwrap()],
    );
    assert!(!read.contains("verification failed"), "{read}");
}
