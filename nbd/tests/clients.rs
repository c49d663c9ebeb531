//! The server against clients no one here wrote: QEMU's (`qemu-img`, `qemu-io`, which
//! negotiate extended headers), libnbd's (`nbdinfo`, `nbdcopy`, `nbdsh`, structured replies)
//! and fio's `ioengine=nbd`.

mod common;

use std::sync::Arc;

use aio_block::format::ImageFormat;
use aio_block::{Image, ImageOptions};
use aio_nbd::{ExportSet, Limits, NbdExport};
use common::{image_dir, raw_image, run, tool, TestServer};

/// Serves `image` as `name` (writable or not) alone.
fn serve(name: &str, image: Image, writable: bool) -> TestServer {
    let exports = ExportSet::new();
    let export = NbdExport::new(name, Arc::new(image)).unwrap();
    exports.insert(export.writable(writable).unwrap()).unwrap();
    TestServer::start(exports, Limits::default(), None)
}

fn open(path: &std::path::Path, format: ImageFormat, writable: bool) -> Image {
    Image::open(path, ImageOptions::new(format).read_only(!writable)).unwrap()
}

/// `qemu-img map --output=json`'s extents as (start, length, data, zero), neighbours with the
/// same flags merged (a map over NBD and one of the file split runs differently).
fn map(args: &[&str]) -> Vec<(u64, u64, bool, bool)> {
    let mut all = vec!["map", "--output=json"];
    all.extend_from_slice(args);
    let out = run("qemu-img", &all);
    let mut merged: Vec<(u64, u64, bool, bool)> = Vec::new();
    for line in out.lines() {
        let field = |key: &str| {
            let at = line.find(&format!("\"{key}\": ")).unwrap() + key.len() + 4;
            line[at..]
                .split([',', '}'])
                .next()
                .unwrap()
                .trim()
                .to_owned()
        };
        let (start, length) = (
            field("start").parse().unwrap(),
            field("length").parse().unwrap(),
        );
        let (data, zero) = (field("data") == "true", field("zero") == "true");
        match merged.last_mut() {
            Some(last) if last.2 == data && last.3 == zero && last.0 + last.1 == start => {
                last.1 += length
            }
            _ => merged.push((start, length, data, zero)),
        }
    }
    merged
}

#[test]
fn block_status_of_a_qcow2_chain_is_qemu_img_maps_of_the_file() {
    let dir = image_dir();
    let d = dir.path();
    let base = d.join("base.qcow2");
    let top = d.join("top.qcow2");
    let b = base.to_str().unwrap();
    let t = top.to_str().unwrap();
    run("qemu-img", &["create", "-q", "-f", "qcow2", b, "64M"]);
    run(
        "qemu-io",
        &["-c", "write -P 0x11 0 4M", "-c", "write -P 0x12 40M 1M", b],
    );
    run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-b", b, "-F", "qcow2", t],
    );
    let script = [
        "write -P 0x21 8M 2M",
        "write -z 40M 512k",
        "write -P 0x22 60M 64k",
    ];
    for c in script {
        run("qemu-io", &["-c", c, t]);
    }
    let server = serve("top", open(&top, ImageFormat::Qcow2, false), false);
    let uri = server.uri("top");
    let file = map(&["-U", t]);
    assert_eq!(map(&["-f", "raw", &uri]), file, "qemu-img map over NBD");
    // nbdinfo --map: offset, length, type; 0 is data, 3 hole and zero.
    let nbdinfo = run("nbdinfo", &["--map", &uri]);
    let mut from_nbdinfo = Vec::new();
    for line in nbdinfo.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let flags: u32 = f[2].parse().unwrap();
        from_nbdinfo.push((
            f[0].parse::<u64>().unwrap(),
            f[1].parse::<u64>().unwrap(),
            flags,
        ));
    }
    let expected: Vec<(u64, u64, u32)> = file
        .iter()
        .map(|&(s, l, data, _)| (s, l, if data { 0 } else { 3 }))
        .collect();
    assert_eq!(from_nbdinfo, expected, "nbdinfo --map");
    run(
        "qemu-img",
        &["compare", "-U", "-f", "qcow2", "-F", "raw", t, &uri],
    );
}

#[test]
fn nbdcopy_both_ways_leaves_equal_images() {
    let dir = image_dir();
    let d = dir.path();
    let src = raw_image(d, "src.raw", 32 << 20, 0x5c, 5 << 20);
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x77 20M 3M",
            src.to_str().unwrap(),
        ],
    );
    let server = serve("src", open(&src, ImageFormat::Raw, false), false);
    let out = d.join("out.raw");
    run("nbdcopy", &[&server.uri("src"), out.to_str().unwrap()]);
    run(
        "qemu-img",
        &[
            "compare",
            "-U",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    );
    drop(server);

    let dst = raw_image(d, "dst.raw", 32 << 20, 0, 0);
    let server = serve("dst", open(&dst, ImageFormat::Raw, true), true);
    run("nbdcopy", &[src.to_str().unwrap(), &server.uri("dst")]);
    drop(server);
    run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
}

#[test]
fn qemu_io_negotiates_extended_headers_and_every_command_works() {
    let dir = image_dir();
    let d = dir.path();
    let img = d.join("disk.qcow2");
    run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", img.to_str().unwrap(), "64M"],
    );
    let server = serve("disk", open(&img, ImageFormat::Qcow2, true), true);
    let uri = server.uri("disk");
    let commands = [
        "write -P 0x31 0 1M",
        "write -P 0x32 -f 2M 64k",
        "write -z 512k 64k",
        "discard 2M 64k",
        "flush",
        "read -P 0x31 0 512k",
        "read -P 0 512k 64k",
        "read -P 0x31 576k 448k",
    ];
    let mut args = vec!["-f", "raw", "--trace", "nbd_receive_option_reply"];
    for c in &commands {
        args.extend(["-c", c]);
    }
    args.push(&uri);
    let out = tool("qemu-io", &args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("failed"), "{text}");
    assert!(
        text.contains("(extended headers), type 1 (ack)"),
        "extended headers not negotiated: {text}"
    );
    drop(server);
    run("qemu-img", &["check", "-q", img.to_str().unwrap()]);
    run(
        "qemu-io",
        &[
            "-c",
            "read -P 0x31 0 512k",
            "-c",
            "read -P 0 512k 64k",
            img.to_str().unwrap(),
        ],
    );
}

#[test]
fn fio_verifies_what_it_wrote_at_depth() {
    let dir = image_dir();
    let img = raw_image(dir.path(), "fio.raw", 16 << 20, 0, 0);
    let server = serve("fio", open(&img, ImageFormat::Raw, true), true);
    let uri = format!("--uri={}", server.uri("fio"));
    let out = run(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &uri,
            "--rw=randwrite",
            "--bs=4k",
            "--size=8M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            // No `local-verify-0-verify.state` in the working directory (the crate's root).
            "--verify_state_save=0",
            "--output-format=terse",
        ],
    );
    // Terse: field 5 is the job's error number.
    assert_eq!(out.split(';').nth(4), Some("0"), "{out}");
}

#[test]
fn nbdsh_sees_structured_replies_block_status_and_fast_zero_refused_where_slow() {
    let dir = image_dir();
    let d = dir.path();
    let raw = raw_image(d, "raw.img", 8 << 20, 0x44, 1 << 20);
    let qcow2 = d.join("q.qcow2");
    run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", qcow2.to_str().unwrap(), "8M"],
    );
    let exports = ExportSet::new();
    let raw_export = NbdExport::new("raw", Arc::new(open(&raw, ImageFormat::Raw, true))).unwrap();
    exports.insert(raw_export.writable(true).unwrap()).unwrap();
    let q = NbdExport::new("q", Arc::new(open(&qcow2, ImageFormat::Qcow2, true))).unwrap();
    exports.insert(q.writable(true).unwrap()).unwrap();
    let server = TestServer::start(exports, Limits::default(), None);
    let script = r#"
import nbd
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(RAW)
assert h.get_structured_replies_negotiated()
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.pread(512, 0) == b'\x44' * 512
seen = []
def extents(context, offset, entries, err):
    seen.extend(entries)
h.block_status(8 << 20, 0, extents, nbd.CMD_FLAG_REQ_ONE)
assert seen == [1 << 20, 0], seen
h.zero(1 << 20, 0, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(512, 0) == b'\0' * 512
chunks = []
def chunk(subbuf, offset, status, err):
    chunks.append((offset, len(subbuf), status))
assert h.pread_structured(65536, 0, chunk) == b'\0' * 65536
assert chunks == [(0, 65536, nbd.READ_HOLE)], chunks
h.shutdown()
q = nbd.NBD()
q.connect_uri(QCOW2)
try:
    q.zero(1 << 20, 0, nbd.CMD_FLAG_FAST_ZERO)
    raise SystemExit('fast zero on qcow2 was not refused')
except nbd.Error as e:
    assert e.errno == 'ENOTSUP', e
q.zero(1 << 20, 0)
q.shutdown()
print('ok')
"#;
    let script = script
        .replace("RAW", &format!("{:?}", server.uri("raw")))
        .replace("QCOW2", &format!("{:?}", server.uri("q")));
    let out = run("nbdsh", &["-c", &script]);
    assert_eq!(out.trim(), "ok");
}

#[test]
fn qemu_img_and_qemu_io_reach_an_export_over_tcp() {
    let dir = image_dir();
    let img = raw_image(dir.path(), "tcp.raw", 8 << 20, 0x3a, 1 << 20);
    let exports = ExportSet::new();
    let export = NbdExport::new("tcp", Arc::new(open(&img, ImageFormat::Raw, true))).unwrap();
    exports.insert(export.writable(true).unwrap()).unwrap();
    let server = TestServer::start_tcp(exports);
    let uri = format!("nbd://127.0.0.1:{}/tcp", server.port.expect("a TCP port"));
    let info = run("qemu-img", &["info", "--output=json", &uri]);
    assert!(info.contains("\"virtual-size\": 8388608"), "{info}");
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x3a 0 1M",
            "-c",
            "write -P 0x4b 2M 64k",
            "-c",
            "read -P 0x4b 2M 64k",
            &uri,
        ],
    );
    assert!(!out.contains("failed"), "{out}");
}
