//! The daemon's command line and life: bad arguments exit 2 naming them, several disks on
//! shared iothreads, queues spread over iothreads, SIGINT ends it cleanly.

mod common;

use std::process::Command;

use common::{connect, image, Daemon};

fn daemon(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aio-storage-daemon"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_exit_2_naming_them() {
    let (dir, img) = image(1 << 20);
    let sock = dir.path().join("s.sock");
    let disk = format!("socket={},image={}", sock.display(), img.display());
    for (args, named) in [
        (vec!["--disk", "socket=/x"], "image"),
        (vec!["--disk", &disk, "--engine", "spdk"], "spdk"),
        (vec!["--disk", &disk, "--fdmon", "kqueue"], "kqueue"),
        (vec!["--disk", &disk, "--iothreads", "0"], "iothreads"),
        (
            vec!["--disk", &disk, "--poll-max-ns", "fast"],
            "poll-max-ns",
        ),
        (vec!["--disk", &disk, "--cpus", "3-1"], "cpus"),
        (
            vec!["--disk", "socket=/tmp/x.sock,image=/nonexistent/img"],
            "/nonexistent/img",
        ),
        (vec![], "--disk"),
    ] {
        let (code, err) = daemon(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains(named),
            "{args:?}: the message names {named}: {err}"
        );
    }
    assert!(!sock.exists());
}

/// Two disks on one socket, and one image served twice with a writer, exit 2 naming both
/// `--disk` arguments, before any socket is made.
#[test]
fn colliding_disks_exit_2_naming_both() {
    let (dir, img) = image(1 << 20);
    let other = dir.path().join("other.img");
    std::fs::write(&other, vec![0u8; 1 << 20]).unwrap();
    let (s1, s2) = (dir.path().join("1.sock"), dir.path().join("2.sock"));
    let spec = |sock: &std::path::Path, img: &std::path::Path, extra: &str| {
        format!("socket={},image={}{extra}", sock.display(), img.display())
    };
    for (first, second, named) in [
        (spec(&s1, &img, ""), spec(&s1, &other, ""), "socket"),
        (spec(&s1, &img, ""), spec(&s2, &img, ""), "read-only"),
        (
            spec(&s1, &img, ",readonly=on"),
            spec(&s2, &img, ""),
            "read-only",
        ),
    ] {
        let (code, err) = daemon(&["--disk", &first, "--disk", &second]);
        assert_eq!(code, 2, "{err}");
        for text in [&first, &second] {
            assert!(
                err.contains(&format!("--disk {text}")),
                "names {text}: {err}"
            );
        }
        assert!(err.contains(named), "{err}");
        assert!(!s1.exists() && !s2.exists(), "no socket made");
    }
}

/// An image whose header is another format's is refused at start, naming the format, unless
/// the disk says `format=raw`; a qcow2 header that is not a usable image exits 2 naming it.
#[test]
fn an_image_of_another_format_is_refused_unless_format_raw() {
    let (dir, _) = image(1 << 20);
    let mut images = Vec::new();
    for (name, magic, format) in [
        ("hand.qed", &b"QED\0"[..], "qed"),
        ("hand.vmdk", b"KDMV", "vmdk"),
        ("hand.luks", b"LUKS\xba\xbe\0\x02", "luks"),
        ("hand.vhdx", b"vhdxfile", "vhdx"),
    ] {
        let path = dir.path().join(name);
        let mut bytes = vec![0u8; 1 << 20];
        bytes[..magic.len()].copy_from_slice(magic);
        std::fs::write(&path, bytes).unwrap();
        images.push((path, format));
    }
    let sock = dir.path().join("s.sock");
    for (path, format) in &images {
        let disk = format!("socket={},image={}", sock.display(), path.display());
        let (code, err) = daemon(&["--disk", &disk]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("is a {format} image")), "{err}");
        assert!(
            err.contains("format=raw"),
            "says how to serve it anyway: {err}"
        );
        assert!(!sock.exists());
    }
    // A qcow2 magic on garbage: taken for qcow2, and refused naming the image.
    let broken = dir.path().join("broken.qcow2");
    let mut bytes = vec![0xffu8; 1 << 20];
    bytes[..8].copy_from_slice(b"QFI\xfb\0\0\0\x03");
    bytes[32..36].fill(0);
    bytes[72..80].fill(0);
    std::fs::write(&broken, bytes).unwrap();
    let disk = format!("socket={},image={}", sock.display(), broken.display());
    let (code, err) = daemon(&["--disk", &disk]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("broken.qcow2"), "{err}");
    // format=raw serves the file as it is: the guest sees the header.
    let args = vec![
        "--disk".to_string(),
        format!(
            "socket={},image={},format=raw",
            sock.display(),
            broken.display()
        ),
    ];
    let d = Daemon::start(&args, vec![sock.clone()]);
    let mut c = connect(&sock, 1, 4096).unwrap();
    c.read(0, 0, 0, 4096, 1);
    assert_eq!(c.wait(0, 1), [(1, 0)]);
    assert_eq!(c.read_buf(0, 4), b"QFI\xfb");
    drop(c);
    assert!(d.terminate().success());
}

#[test]
fn several_disks_share_the_iothreads_and_queues_spread_over_them() {
    let (dir, img_a) = image(8 << 20);
    let img_b = dir.path().join("b.img");
    std::fs::File::create(&img_b)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let (sa, sb) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let args: Vec<String> = [
        "--disk".to_string(),
        format!(
            "socket={},image={},queues=4,serial=a",
            sa.display(),
            img_a.display()
        ),
        "--disk".to_string(),
        format!("socket={},image={},serial=b", sb.display(), img_b.display()),
        "--iothreads".to_string(),
        "2".to_string(),
        "--fdmon".to_string(),
        "epoll".to_string(),
    ]
    .into();
    let d = Daemon::start(&args, vec![sa.clone(), sb.clone()]);
    let mut a = connect(&sa, 4, 4 * 4096).unwrap();
    let mut b = connect(&sb, 1, 4096).unwrap();
    assert_eq!(
        (a.capacity().unwrap(), b.capacity().unwrap()),
        (8 << 20, 4 << 20)
    );
    for q in 0..4 {
        a.fill_buf(q * 4096, 4096, q as u8 + 1);
        a.write(q, q as u64 * 4096, q * 4096, 4096, q);
    }
    for q in 0..4 {
        assert_eq!(a.wait(q, 1)[0].1, 0, "queue {q} on iothread {}", q % 2);
    }
    b.read(0, 0, 0, 4096, 9);
    assert_eq!(b.wait(0, 1)[0].1, 0);
    for q in 0..4 {
        a.read(q, q as u64 * 4096, q * 4096, 4096, q);
        assert_eq!(a.wait(q, 1)[0].1, 0);
        assert!(a.read_buf(q * 4096, 4096).iter().all(|&x| x == q as u8 + 1));
    }
    drop((a, b));
    // SIGINT, like SIGTERM, ends the daemon with 0 and removes every socket.
    assert!(d.stop_with(nix::sys::signal::Signal::SIGINT).success());
    assert!(!sa.exists() && !sb.exists());
}

/// An upgrade: a second daemon binds the socket's path while the first still serves a client;
/// SIGTERM lets the first finish (exit 0) without removing the path, which now reaches the
/// second, with another engine, on the same image.
#[test]
fn a_successor_keeps_the_socket_when_the_old_daemon_stops() {
    let (dir, img) = image(4 << 20);
    let old = Daemon::one_disk(dir.path(), &img, "pool", ",serial=up");
    let socket = old.socket().to_path_buf();
    let mut client = connect(&socket, 1, 4096).unwrap();
    client.fill_buf(0, 4096, 0x3c);
    client.write(0, 8192, 0, 4096, 1);
    assert_eq!(client.wait(0, 1)[0].1, 0);
    // The same --disk: its image is the old daemon's until it has drained, so the new one
    // takes the image's lock when the client connects again.
    let args: Vec<String> = [
        "--disk".to_string(),
        format!(
            "socket={},image={},serial=up",
            socket.display(),
            img.display()
        ),
        "--engine".into(),
        "linux-aio".into(),
    ]
    .into();
    let new = Daemon::start_replacing(&args, vec![socket.clone()]);
    assert!(old.terminate().success());
    drop(client);
    assert!(socket.exists(), "the successor's socket is still there");
    let mut client = connect(&socket, 1, 4096).unwrap();
    client.read(0, 8192, 0, 4096, 2);
    assert_eq!(client.wait(0, 1)[0].1, 0);
    assert!(client.read_buf(0, 4096).iter().all(|&x| x == 0x3c));
    drop(client);
    // The new daemon holds the image's lock now: another writer is refused.
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write 0 4k"])
        .arg(&img)
        .output()
        .expect("qemu-io (install qemu-utils)");
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(new.terminate().success());
    assert!(!socket.exists());
}

/// An upgrade of a qcow2 disk: the successor opens the image inactive (read-only, unlocked)
/// while the old daemon still allocates clusters, and reads them once it has taken the
/// image's locks (its metadata read afresh when the client connects again).
#[test]
fn a_successor_reads_what_the_old_daemon_allocated_in_a_qcow2_image() {
    let (dir, _) = image(1 << 20);
    let img = dir.path().join("disk.qcow2");
    let made = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&img)
        .arg("16M")
        .status()
        .expect("qemu-img (install qemu-utils)");
    assert!(made.success());
    let old = Daemon::one_disk(dir.path(), &img, "pool", ",serial=up");
    let socket = old.socket().to_path_buf();
    let mut client = connect(&socket, 1, 4096).unwrap();
    client.fill_buf(0, 4096, 0x3c);
    client.write(0, 8192, 0, 4096, 1);
    assert_eq!(client.wait(0, 1)[0].1, 0);
    let args: Vec<String> = [
        "--disk".to_string(),
        format!(
            "socket={},image={},serial=up",
            socket.display(),
            img.display()
        ),
    ]
    .into();
    let new = Daemon::start_replacing(&args, vec![socket.clone()]);
    // A cluster allocated after the successor read the image's metadata.
    client.fill_buf(0, 4096, 0x5d);
    client.write(0, 8 << 20, 0, 4096, 2);
    assert_eq!(client.wait(0, 1)[0].1, 0);
    assert!(old.terminate().success());
    drop(client);
    let mut client = connect(&socket, 1, 4096).unwrap();
    for (i, (offset, byte)) in [(8192u64, 0x3c), (8 << 20, 0x5d)].into_iter().enumerate() {
        client.read(0, offset, 0, 4096, 3 + i);
        assert_eq!(client.wait(0, 1)[0].1, 0);
        assert!(
            client.read_buf(0, 4096).iter().all(|&x| x == byte),
            "{offset}"
        );
    }
    client.fill_buf(0, 4096, 0x6e);
    client.write(0, 12 << 20, 0, 4096, 9);
    assert_eq!(client.wait(0, 1)[0].1, 0);
    drop(client);
    assert!(new.terminate().success());
    let check = Command::new("qemu-img")
        .arg("check")
        .arg(&img)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
}

/// The daemon's name before it was a crate of its own still runs it, for one release.
#[test]
fn the_old_name_runs_the_same_daemon() {
    let old = Command::new(env!("CARGO_BIN_EXE_aio-vhost-user-blk"))
        .arg("--disk")
        .arg("socket=/x")
        .output()
        .unwrap();
    assert_eq!(old.status.code(), Some(2));
    let (code, new) = daemon(&["--disk", "socket=/x"]);
    assert_eq!(code, 2);
    assert_eq!(String::from_utf8_lossy(&old.stderr), new);
}
