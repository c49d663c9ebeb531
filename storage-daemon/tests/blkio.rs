//! libblkio's virtio-blk driver against the daemon, for every engine: reads and writes
//! verified at QD 1 and 32 over several queues, flush, discard and write-zeroes, read-only
//! disks, and clients that vanish mid-flight.

mod common;

use aio_test_support::data::stamp;
use aio_test_support::procfs::Proc;
use blkio::ReqFlags;
use common::{connect, image, Daemon};

const MIB: u64 = 1 << 20;

fn verify_rw(engine: &str, queues: usize, depth: usize) {
    let (dir, img) = image(64 * MIB);
    let d = Daemon::one_disk(
        dir.path(),
        &img,
        engine,
        &format!(",queues={queues},serial=t1"),
    );
    let bs = 4096usize;
    let mut c = connect(d.socket(), queues, queues * depth * bs).unwrap();
    assert_eq!(c.capacity().unwrap(), 64 * MIB);
    for generation in [1u64, 2] {
        for q in 0..queues {
            for i in 0..depth {
                let slot = (q * depth + i) * bs;
                let offset = ((q * depth + i) * 7 * bs) as u64;
                let mut data = vec![0u8; bs];
                stamp(&mut data, offset, generation);
                c.write_buf(slot, &data);
                c.write(q, offset, slot, bs, slot);
            }
        }
        for q in 0..queues {
            for (_, ret) in c.wait(q, depth) {
                assert_eq!(ret, 0, "{engine}: write failed");
            }
        }
        for q in 0..queues {
            for i in 0..depth {
                let slot = (q * depth + i) * bs;
                c.fill_buf(slot, bs, 0);
                c.read(q, ((q * depth + i) * 7 * bs) as u64, slot, bs, slot);
            }
        }
        for q in 0..queues {
            for (slot, ret) in c.wait(q, depth) {
                assert_eq!(ret, 0, "{engine}: read failed");
                let offset = (slot * 7) as u64;
                let mut want = vec![0u8; bs];
                stamp(&mut want, offset, generation);
                assert!(
                    c.read_buf(slot, bs) == want,
                    "{engine}: data at {offset} differs"
                );
            }
        }
    }
    drop(c);
    assert!(d.terminate().success());
}

#[test]
fn reads_and_writes_verify_at_qd1_and_qd32_over_several_queues() {
    for engine in common::engines() {
        verify_rw(engine, 1, 1);
        verify_rw(engine, 3, 32);
    }
}

#[test]
fn flush_discard_and_write_zeroes() {
    for engine in common::engines() {
        let (dir, img) = image(16 * MIB);
        let d = Daemon::one_disk(dir.path(), &img, engine, "");
        let mut c = connect(d.socket(), 1, 1 << 20).unwrap();
        c.fill_buf(0, 1 << 20, 0xab);
        c.write(0, 0, 0, 1 << 20, 0);
        assert_eq!(c.wait(0, 1)[0].1, 0);
        assert_eq!(
            c.sync(0, |q| q.flush(1, ReqFlags::empty())),
            0,
            "{engine}: flush"
        );
        assert_eq!(
            c.sync(0, |q| q.write_zeroes(0, 65536, 2, ReqFlags::empty())),
            0,
            "{engine}: write-zeroes"
        );
        assert_eq!(
            c.sync(0, |q| q.discard(65536, 65536, 3, ReqFlags::empty())),
            0,
            "{engine}: discard"
        );
        c.fill_buf(0, 1 << 20, 0xff);
        c.read(0, 0, 0, 131072, 4);
        assert_eq!(c.wait(0, 1)[0].1, 0);
        assert!(
            c.read_buf(0, 65536).iter().all(|&b| b == 0),
            "{engine}: write-zeroes reads back zeroes"
        );
        // A discarded range of a file on tmpfs reads back as zeroes (a hole).
        assert!(
            c.read_buf(65536, 65536).iter().all(|&b| b == 0),
            "{engine}: discard reads back zeroes"
        );
        c.read(0, 131072, 0, 4096, 5);
        assert_eq!(c.wait(0, 1)[0].1, 0);
        assert!(
            c.read_buf(0, 4096).iter().all(|&b| b == 0xab),
            "{engine}: data beyond the ranges stays"
        );
    }
}

#[test]
fn a_read_only_disk_refuses_writes() {
    let (dir, img) = image(4 * MIB);
    let d = Daemon::one_disk(dir.path(), &img, "auto", ",readonly=on");
    // The driver sees VIRTIO_BLK_F_RO: a writable client is refused at start.
    let e = connect(d.socket(), 1, 8192).expect_err("a writable start must fail");
    let common::ClientError::Blkio { source, .. } = &e else {
        panic!("not libblkio's refusal: {e}")
    };
    assert_eq!(source.errno().raw_os_error(), libc::EROFS, "{e:?}");
    let mut c = common::connect_read_only(d.socket(), 8192).unwrap();
    c.read(0, 0, 0, 4096, 1);
    assert_eq!(c.wait(0, 1)[0].1, 0);
    // The chain parser's unit tests show the device refusing a write a driver sends anyway.
}

/// The daemon's open fds and resident memory (kB).
fn daemon_usage(pid: u32) -> (usize, u64) {
    let daemon = Proc::of(pid);
    (daemon.fd_count(), daemon.rss_kib())
}

/// Run in a child process by `a_client_killed_mid_flight_leaves_the_daemon_serving`: connects,
/// puts 32 reads and 32 writes in flight, says so, and waits to be killed.
#[test]
#[ignore = "a helper process of another test"]
fn client_process_killed_mid_flight() {
    let Ok(socket) = std::env::var("AIO_VUB_CHILD_SOCKET") else {
        return;
    };
    let mut c = connect(std::path::Path::new(&socket), 1, 64 * 4096).unwrap();
    for i in 0..32 {
        c.write(0, i * 8192, i as usize * 4096, 4096, i as usize);
        c.read(
            0,
            i * 8192 + 4096,
            (32 + i as usize) * 4096,
            4096,
            100 + i as usize,
        );
    }
    // Submitted without waiting for a completion.
    let mut now = std::time::Duration::ZERO;
    c.queue(0).do_io(&mut [], 0, Some(&mut now), None).unwrap();
    println!("IN-FLIGHT");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_client_killed_mid_flight_leaves_the_daemon_serving() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    for engine in common::engines() {
        let (dir, img) = image(16 * MIB);
        let d = Daemon::one_disk(dir.path(), &img, engine, "");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "client_process_killed_mid_flight",
                "--ignored",
                "--nocapture",
            ])
            .env("AIO_VUB_CHILD_SOCKET", d.socket())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert!(
            lines.any(|l| l.unwrap().contains("IN-FLIGHT")),
            "{engine}: the child client did not start"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        // A new client is served once the old one's requests have completed.
        let mut c = connect(d.socket(), 1, 8192).unwrap();
        c.fill_buf(0, 4096, 7);
        c.write(0, 0, 0, 4096, 1);
        assert_eq!(c.wait(0, 1)[0].1, 0, "{engine}");
        c.read(0, 0, 4096, 4096, 2);
        assert_eq!(c.wait(0, 1)[0].1, 0, "{engine}");
        assert!(c.read_buf(4096, 4096).iter().all(|&b| b == 7), "{engine}");
        drop(c);
        assert!(
            d.terminate().success(),
            "{engine}: SIGTERM ends the daemon with 0"
        );
    }
}

#[test]
fn a_hundred_connections_leak_no_fds_nor_memory() {
    let (dir, img) = image(16 * MIB);
    let d = Daemon::one_disk(dir.path(), &img, "auto", ",queues=2");
    let cycle = || {
        let mut c = connect(d.socket(), 2, 65536).unwrap();
        for q in 0..2 {
            c.read(q, 0, q * 4096, 4096, q);
            assert_eq!(c.wait(q, 1)[0].1, 0);
        }
    };
    // The first connections warm up what stays (the engine's rings, the allocator).
    for _ in 0..5 {
        cycle();
    }
    // The daemon closes a connection when it reads its end, in its own time: the baseline is
    // taken once the count has held still for 100 ms, the final count once it is back down to
    // it (10 s at most, for a loaded machine).
    let steady = || {
        let (mut last, mut same) = (daemon_usage(d.pid()), 0);
        while same < 10 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let now = daemon_usage(d.pid());
            same = if now.0 == last.0 { same + 1 } else { 0 };
            last = now;
        }
        last
    };
    let (fds0, rss0) = steady();
    for _ in 0..100 {
        cycle();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (fds1, rss1) = loop {
        let now = daemon_usage(d.pid());
        if now.0 <= fds0 || std::time::Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(
        fds1 <= fds0,
        "fds after 100 connections: {fds1}, before: {fds0}"
    );
    assert!(
        rss1 < rss0 + 4096,
        "RSS grew from {rss0} kB to {rss1} kB over 100 connections"
    );
    let socket = d.socket().to_path_buf();
    assert!(d.terminate().success());
    assert!(!socket.exists(), "SIGTERM removes the socket");
}
