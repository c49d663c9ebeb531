//! The step of QEMU's iotest `tests/qemu-img-bitmaps` that needs a server ("Check bitmap
//! contents"), served by this daemon, by qemu-storage-daemon and by `qemu-nbd` (the server
//! the iotest itself runs), every output compared with the others and with the iotest's
//! expected output:
//!
//! 1. the iotest's images, made as it makes them with `qemu-img` and `qemu-io`: a base with
//!    bitmap `b0`, an image over it with `b1` (512 KiB granularity) and `b2`, enabled,
//!    disabled and cleared between writes, `qemu-img convert --bitmaps` of it, `b0` merged in
//!    from the base, the copy rebased (`-u`) on the base and `b3` added to the base, merged
//!    from the copy's `b2`;
//! 2. the copy served read-only over NBD with the four bitmaps (`b3` found in its backing
//!    file, as `qemu-nbd -B` finds it), and `qemu-img map` through
//!    `x-dirty-bitmap=qemu:dirty-bitmap:bN` of each: the ranges each bitmap marks.
//!
//! The iotest's other steps run `qemu-img` alone. Needs `qemu-img`, `qemu-io` and `qemu-nbd`
//! (qemu-utils), and `qemu-storage-daemon` for the comparison.

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;
use std::time::Duration;

use aio_conformance::skip;
use aio_test_support::launch::Launch;
use bitmap_steps::run;

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// The iotest's expected maps (`qemu-img-bitmaps.out`), `b0` to `b3`, offsets filtered:
/// (start, length, data) per extent, `data: false` where the bitmap is set.
const EXPECTED: [&[(u64, u64, bool)]; 4] = [
    &[
        (0, 3145728, true),
        (3145728, 1048576, false),
        (4194304, 6291456, true),
    ],
    &[
        (0, 1048576, true),
        (1048576, 1048576, false),
        (2097152, 8388608, true),
    ],
    &[
        (0, 2097152, true),
        (2097152, 1048576, false),
        (3145728, 7340032, true),
    ],
    &[
        (0, 2097152, true),
        (2097152, 1048576, false),
        (3145728, 7340032, true),
    ],
];

/// The iotest's "Initial image setup" and "Convert with bitmap preservation" and "Merge from
/// top layer into backing image": `dir/t.qcow2` over `dir/t.qcow2.base`.
fn images(dir: &Path) -> String {
    let img = dir.join("t.qcow2").to_str().unwrap().to_string();
    let (base, orig) = (format!("{img}.base"), format!("{img}.orig"));
    let qemu_img = |args: &[&str]| run("qemu-img", args);
    let qemu_io = |cmd: &str, image: &str| run("qemu-io", &["-f", "qcow2", "-c", cmd, image]);
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "10M"]);
    qemu_img(&["bitmap", "--add", "-f", "qcow2", &base, "b0"]);
    qemu_io("w 3M 1M", &base);
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &base, "-F", "qcow2", &orig, "10M",
    ]);
    qemu_io("w 0 1M", &orig);
    qemu_img(&["bitmap", "--add", "-g", "512k", "-f", "qcow2", &orig, "b1"]);
    qemu_img(&["bitmap", "--add", "--disable", "-f", "qcow2", &orig, "b2"]);
    qemu_io("w 3M 1M", &orig);
    qemu_img(&["bitmap", "--clear", "-f", "qcow2", &orig, "b1"]);
    qemu_io("w 1M 1M", &orig);
    qemu_img(&["bitmap", "--disable", "-f", "qcow2", &orig, "b1"]);
    qemu_img(&["bitmap", "--enable", "-f", "qcow2", &orig, "b2"]);
    qemu_io("w 2M 1M", &orig);
    qemu_img(&["convert", "--bitmaps", "-O", "qcow2", &orig, &img]);
    qemu_img(&["bitmap", "--add", "--disable", "-f", "qcow2", &img, "b0"]);
    qemu_img(&[
        "bitmap", "--add", "--merge", "b0", "-b", &base, "-F", "qcow2", "-f", "qcow2", &img, "tmp",
    ]);
    qemu_img(&["bitmap", "--merge", "tmp", "-f", "qcow2", &img, "b0"]);
    qemu_img(&["bitmap", "--remove", "-f", "qcow2", &img, "tmp"]);
    qemu_img(&["rebase", "-u", "-F", "qcow2", "-b", &base, &img]);
    qemu_img(&[
        "bitmap", "--add", "--merge", "b2", "-b", &img, "-F", "qcow2", "-f", "qcow2", &base, "b3",
    ]);
    img
}

/// `image` served read-only on `socket` with bitmaps b0..b3 by `server` (a daemon taking
/// qemu-storage-daemon's command line, or `qemu-nbd` with the iotest's arguments); each
/// bitmap's map (start, length, data) as `qemu-img map` shows it through `x-dirty-bitmap`.
fn maps(server: &str, image: &str, dir: &Path) -> Vec<Vec<(u64, u64, bool)>> {
    let label = Path::new(server).file_name().unwrap().to_str().unwrap();
    let socket = dir.join(format!("{label}.sock"));
    let args: Vec<String> = if server == "qemu-nbd" {
        // The iotests' `nbd_server_start_unix_socket`: persistent (`-t`).
        let mut a = vec![
            "-t".to_string(),
            "-k".into(),
            socket.display().to_string(),
            "-r".into(),
        ];
        a.extend(
            [
                "-f", "qcow2", "-B", "b0", "-B", "b1", "-B", "b2", "-B", "b3",
            ]
            .map(String::from),
        );
        a.push(image.to_string());
        a
    } else {
        vec![
            "--blockdev".into(),
            format!("driver=file,node-name=file0,filename={image},read-only=on"),
            "--blockdev".into(),
            "driver=qcow2,node-name=fmt,file=file0,read-only=on".into(),
            "--nbd-server".into(),
            format!("addr.type=unix,addr.path={}", socket.display()),
            "--export".into(),
            "type=nbd,id=e,node-name=fmt,name=,bitmaps.0=b0,bitmaps.1=b1,bitmaps.2=b2,\
             bitmaps.3=b3"
                .into(),
        ]
    };
    let _server = Launch::new(server)
        .args(args)
        .label(server)
        .log_to(dir.join(format!("{label}.log")))
        .socket(socket.clone())
        .socket_wait(Duration::from_secs(20))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    (0..4)
        .map(|k| {
            let opts = format!(
                "driver=nbd,server.type=unix,server.path={},x-dirty-bitmap=qemu:dirty-bitmap:b{k}",
                socket.display()
            );
            let out = run("qemu-img", &["map", "--output=json", "--image-opts", &opts]);
            let extents: serde_json::Value = serde_json::from_str(&out).unwrap();
            extents
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["start"].as_u64().unwrap(),
                        e["length"].as_u64().unwrap(),
                        e["data"].as_bool().unwrap(),
                    )
                })
                .collect()
        })
        .collect()
}

#[test]
fn qemu_img_bitmaps_contents_over_nbd_are_qemu_nbds_and_the_iotests() {
    if !common::runnable("qemu-nbd") {
        skip("qemu-nbd is not installed (Debian package qemu-utils)");
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let image = images(dir.path());
    let expected: Vec<Vec<(u64, u64, bool)>> = EXPECTED.iter().map(|m| m.to_vec()).collect();
    let ours = maps(OURS, &image, dir.path());
    assert_eq!(ours, expected, "ours / the iotest's expected output");
    assert_eq!(maps("qemu-nbd", &image, dir.path()), expected, "qemu-nbd");
    if common::runnable("qemu-storage-daemon") {
        let theirs = maps("qemu-storage-daemon", &image, dir.path());
        assert_eq!(theirs, expected, "qemu-storage-daemon");
    } else {
        skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
    }
    // Serving changed nothing: the images are still clean with their bitmaps.
    for image in [image.clone(), format!("{image}.base")] {
        run("qemu-img", &["check", "-q", &image]);
        let info = run("qemu-img", &["info", "--output=json", &image]);
        assert!(!info.contains("in-use"), "{info}");
    }
}
