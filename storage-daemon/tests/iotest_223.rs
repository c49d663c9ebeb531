//! The NBD half of QEMU's iotest 223 ("NBD export of a dirty bitmap"), step by step against
//! this daemon and qemu-storage-daemon (the test itself runs QEMU's system binary, which
//! `QSD_PROG` does not replace), every reply and every client's output compared:
//!
//! 1. a 4 MiB qcow2 image (4 KiB clusters) written at 1M..3M, then two persistent bitmaps
//!    added by the daemon (`b` at 64 KiB, `b2` at 512 bytes) and stored at its `quit`;
//! 2. `qemu-io` writes into the image under the bitmaps (512 bytes at 512, 2M at 2M);
//! 3. the daemon again: `b` disabled, a null node with bitmap `b3`; `nbd-server-add` before
//!    the server (refused), the server started twice (refused), `qemu-nbd -L`, an export with
//!    `b`, the missing node, the same name twice, an enabled bitmap on a read-only export, a
//!    bitmap the node lacks (all refused), a writable export with `b2` and a description,
//!    `block-export-add` with `{node: null, name: b3}`, `qemu-nbd -L` again;
//! 4. reads with `qemu-io` over NBD, and `qemu-img map` of each export, plain and through
//!    `x-dirty-bitmap=qemu:dirty-bitmap:NAME`;
//! 5. `nbd-server-remove` (twice for one: refused), `nbd-server-stop` (twice: refused).
//!
//! Needs `qemu-img`, `qemu-io`, `qemu-nbd` (qemu-utils), and `qemu-storage-daemon` for the
//! comparison.

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// `program args`' stdout and whether it succeeded, `dir` written `$DIR` and `qemu-io`'s
/// timings left out (as the iotests' `_filter_qemu_io`).
fn output(dir: &Path, program: &str, args: &[&str]) -> Value {
    let out = Command::new(program).args(args).output().expect(program);
    let text: String = String::from_utf8_lossy(&out.stdout)
        .replace(dir.to_str().unwrap(), "$DIR")
        .lines()
        .filter(|l| !l.contains(" ops; "))
        .map(|l| format!("{l}\n"))
        .collect();
    json!([out.status.success(), text])
}

/// `qemu-nbd -L`'s listing without the two things known to differ: qemu-storage-daemon offers `block-status-payload` (NBD's block status
/// filtered by context), which this daemon does not yet, and its minimum block is 1 where
/// this daemon's `O_DIRECT` opening makes it 512.
fn listed(out: Value) -> Value {
    let text: String = out[1]
        .as_str()
        .unwrap()
        .lines()
        .map(|l| match l.trim_start() {
            t if t.starts_with("flags:") => {
                let words = t.split_once('(').map_or("", |(_, w)| w);
                format!("  flags: ({}\n", words.replace(" block-status-payload", ""))
            }
            t if t.starts_with("min block:") => "  min block: (alignment)\n".to_string(),
            _ => format!("{l}\n"),
        })
        .collect();
    json!([out[0], text])
}

fn steps(program: &str) -> Vec<Value> {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    let image = d.join("t.qcow2").to_str().unwrap().to_string();
    common::qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=4k",
        &image,
        "4M",
    ]);
    let mut seen = vec![output(d, "qemu-io", &["-c", "w -P 0x11 1M 2M", &image])];
    let node = json!({"driver": "qcow2", "node-name": "n",
                      "file": {"driver": "file", "filename": image}});

    // The bitmaps, added by the daemon and stored at its quit.
    {
        let (daemon, mut q) = bitmap_steps::daemon(program, d);
        seen.push(q.call("blockdev-add", node.clone()));
        for (name, granularity) in [("b", 65536), ("b2", 512)] {
            seen.push(q.call(
                "block-dirty-bitmap-add",
                json!({"node": "n", "name": name, "persistent": true,
                       "granularity": granularity}),
            ));
        }
        seen.push(q.call("quit", json!({})));
        let exited = daemon.wait_exit(std::time::Duration::from_secs(20));
        assert!(exited.is_some_and(|s| s.success()), "{program}: {exited:?}");
    }
    seen.push(output(
        d,
        "qemu-io",
        &["-c", "w -P 0x22 512 512", "-c", "w -P 0x33 2M 2M", &image],
    ));

    // Served over NBD.
    let (_daemon, mut q) = bitmap_steps::daemon(program, d);
    let q = &mut q;
    let sock = d.join("nbd").to_str().unwrap().to_string();
    seen.push(q.call("blockdev-add", node));
    seen.push(q.call(
        "block-dirty-bitmap-disable",
        json!({"node": "n", "name": "b"}),
    ));
    seen.push(q.call(
        "blockdev-add",
        json!({"driver": "null-co", "node-name": "null", "size": 4194304}),
    ));
    seen.push(q.call(
        "block-dirty-bitmap-add",
        json!({"node": "null", "name": "b3"}),
    ));
    seen.push(q.call("nbd-server-add", json!({"device": "n"})));
    let server = |path: &str| json!({"addr": {"type": "unix", "data": {"path": path}}});
    seen.push(q.call("nbd-server-start", server(&sock)));
    seen.push(q.call("nbd-server-start", server(&format!("{sock}1"))));
    seen.push(listed(output(d, "qemu-nbd", &["-L", "-k", &sock])));
    for args in [
        json!({"device": "n", "bitmap": "b"}),
        json!({"device": "nosuch"}),
        json!({"device": "n"}),
        json!({"device": "n", "name": "n2", "bitmap": "b2"}),
        json!({"device": "n", "name": "n2", "bitmap": "b3"}),
        json!({"device": "n", "name": "n2", "writable": true, "description": "some text",
               "bitmap": "b2"}),
    ] {
        seen.push(q.call("nbd-server-add", args));
    }
    seen.push(q.call(
        "block-export-add",
        json!({"type": "nbd", "node-name": "n", "id": "n3", "name": "n3",
               "bitmaps": [{"node": "null", "name": "b3"}]}),
    ));
    seen.push(listed(output(d, "qemu-nbd", &["-L", "-k", &sock])));

    // Normal status against the bitmaps' of large and small granularity, and another node's.
    let opts =
        |export: &str| format!("driver=nbd,export={export},server.type=unix,server.path={sock}");
    seen.push(output(
        d,
        "qemu-io",
        &[
            "-r",
            "-c",
            "r -P 0x22 512 512",
            "-c",
            "r -P 0 512k 512k",
            "-c",
            "r -P 0x11 1m 1m",
            "-c",
            "r -P 0x33 2m 2m",
            "--image-opts",
            &opts("n"),
        ],
    ));
    let map = |image_opts: String| {
        output(
            d,
            "qemu-img",
            &["map", "--output=json", "--image-opts", &image_opts],
        )
    };
    seen.push(map(opts("n")));
    seen.push(map(format!(
        "{},x-dirty-bitmap=qemu:dirty-bitmap:b",
        opts("n")
    )));
    seen.push(map(format!(
        "{},x-dirty-bitmap=qemu:dirty-bitmap:b2",
        opts("n2")
    )));
    seen.push(map(format!(
        "{},x-dirty-bitmap=qemu:dirty-bitmap:b3",
        opts("n3")
    )));

    for name in ["n", "n2", "n2"] {
        seen.push(q.call_once_clients_gone("nbd-server-remove", json!({ "name": name })));
    }
    seen.push(q.call("nbd-server-stop", json!({})));
    seen.push(q.call("nbd-server-stop", json!({})));
    seen
}

#[test]
fn qemus_iotest_223_nbd_half_answers_as_qemu_storage_daemon() {
    let ours = steps(OURS);
    bitmap_steps::same_as_qemu_storage_daemon(OURS, |program| match program {
        OURS => ours.clone(),
        other => steps(other),
    });
}
