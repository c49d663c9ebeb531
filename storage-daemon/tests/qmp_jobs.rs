//! `blockdev-create` jobs and the job commands, run against this daemon and
//! qemu-storage-daemon with the same steps, their replies and `JOB_STATUS_CHANGE` events
//! compared (names and data; the temporary directory's path written `$DIR`):
//!
//! * libvirt's creation of a pull backup's scratch image: a `file` created by a job, waited
//!   for, dismissed, added as a node; a qcow2 image created on it with a backing file;
//!   dismissed; the qcow2 node added;
//! * the images made: equal in `qemu-img info` (size, format, cluster size, backing file and
//!   format, compat level, lazy refcounts, refcount width) and clean in `qemu-img check`, for
//!   v3 and v2 and non-default options;
//! * the refusals: an unknown job, a duplicate or invalid job id, every verb a concluded job
//!   refuses (QEMU's "cannot accept command verb"), a driver that cannot create, and jobs
//!   that fail (a missing directory, a missing node, options QEMU refuses) with QEMU's text
//!   in `query-jobs`.
//!
//! A job is waited for by its `concluded` event, never by sleeping. Needs `qemu-img`, and
//! `qemu-storage-daemon` for the comparison (Debian's `qemu-utils`).

#[path = "common/bitmaps.rs"]
mod bitmap_steps;
mod common;
#[path = "common/qmp.rs"]
mod qmp_client;

use std::path::Path;
use std::process::Command;

use qmp_client::Qmp;
use serde_json::{json, Value};

const OURS: &str = env!("CARGO_BIN_EXE_aio-storage-daemon");

/// Reads events until job `id`'s `JOB_STATUS_CHANGE` to `status` has come.
fn wait_status(q: &mut Qmp, id: &str, status: &str) {
    let seen = |q: &Qmp| {
        q.events.iter().any(|e| {
            e["event"] == "JOB_STATUS_CHANGE"
                && e["data"]["id"] == id
                && e["data"]["status"] == status
        })
    };
    while !seen(q) {
        let v = q
            .line()
            .unwrap_or_else(|| panic!("no {status} event for job {id}: {:?}", q.events));
        assert!(v.get("event").is_some(), "not an event: {v}");
        q.events.push(v);
    }
}

/// `blockdev-create` of `options` as job `id`, its reply; the job waited for when accepted.
fn create(q: &mut Qmp, id: &str, options: Value) -> Value {
    let reply = q.call("blockdev-create", json!({"job-id": id, "options": options}));
    if reply.get("return").is_some() {
        wait_status(q, id, "concluded");
    }
    reply
}

/// Job `id` as `query-jobs` lists it.
fn job(q: &mut Qmp, id: &str) -> Value {
    let jobs = q.ok("query-jobs", json!({}));
    jobs.as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .unwrap_or_else(|| panic!("no job {id} in {jobs}"))
        .clone()
}

/// What `qemu-img info` says of `image` that creation decides.
fn image_info(image: &Path) -> Value {
    let out = Command::new("qemu-img")
        .args(["info", "-U", "--output=json", image.to_str().unwrap()])
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    let data = &info["format-specific"]["data"];
    json!({
        "virtual-size": info["virtual-size"],
        "format": info["format"],
        "cluster-size": info["cluster-size"],
        "backing-filename": info["backing-filename"],
        "backing-filename-format": info["backing-filename-format"],
        "compat": data["compat"],
        "lazy-refcounts": data["lazy-refcounts"],
        "refcount-bits": data["refcount-bits"],
    })
}

/// `qemu-img check` finds `image` clean.
fn check_clean(program: &str, image: &Path) {
    let out = Command::new("qemu-img")
        .args(["check", image.to_str().unwrap()])
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "{program}: qemu-img check {}: {}{}",
        image.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The steps run against `program`: what each answered, with `dir` written `$DIR`.
fn steps(program: &str) -> (Vec<Value>, Vec<Value>) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = dir.path();
    let path = |name: &str| d.join(name).to_str().unwrap().to_string();
    let (_daemon, mut q) = bitmap_steps::daemon(program, d);
    let mut seen = Vec::new();
    let base = path("base.raw");
    common::qemu_img(&["create", "-q", "-f", "raw", &base, "64M"]);

    // libvirt's scratch image: the file, then the qcow2 on it.
    let scratch = path("scratch.qcow2");
    let file = json!({"driver": "file", "filename": scratch, "size": 0});
    seen.push(create(&mut q, "create-file", file));
    let concluded = job(&mut q, "create-file");
    assert_eq!(concluded["status"], "concluded", "{program}: {concluded}");
    seen.push(q.ok("query-jobs", json!({})));
    seen.push(q.ok("query-block-jobs", json!({})));
    for verb in [
        "job-complete",
        "job-finalize",
        "job-cancel",
        "job-pause",
        "job-resume",
    ] {
        seen.push(q.call(verb, json!({"id": "create-file"})));
    }
    seen.push(q.call("job-dismiss", json!({"id": "create-file"})));
    seen.push(q.call("job-dismiss", json!({"id": "create-file"})));
    seen.push(q.ok("query-jobs", json!({})));
    q.ok(
        "blockdev-add",
        json!({"driver": "file", "node-name": "scratch-file", "filename": scratch}),
    );
    let qcow2 = json!({
        "driver": "qcow2", "file": "scratch-file", "size": 64 << 20,
        "backing-file": base, "backing-fmt": "raw",
    });
    seen.push(create(&mut q, "create-fmt", qcow2));
    seen.push(job(&mut q, "create-fmt"));
    seen.push(q.call("job-dismiss", json!({"id": "create-fmt"})));
    q.ok(
        "blockdev-add",
        json!({"driver": "qcow2", "node-name": "scratch", "file": "scratch-file"}),
    );
    let nodes = q.ok("query-named-block-nodes", json!({"flat": true}));
    let node = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node-name"] == "scratch");
    assert_eq!(
        node.map(|n| n["image"]["virtual-size"].clone()),
        Some(json!(64 << 20)),
        "{program}: {nodes}"
    );
    seen.push(image_info(Path::new(&scratch)));
    q.ok("blockdev-del", json!({"node-name": "scratch"}));
    check_clean(program, Path::new(&scratch));

    // Other versions and options.
    for (n, extra) in [
        json!({"version": "v2", "cluster-size": 4096}),
        json!({"lazy-refcounts": true, "refcount-bits": 64, "cluster-size": 2 << 20}),
        json!({"backing-file": "base.raw"}),
    ]
    .into_iter()
    .enumerate()
    {
        let image = path(&format!("more{n}.qcow2"));
        let id = format!("more{n}");
        create(
            &mut q,
            &format!("{id}-file"),
            json!({"driver": "file", "filename": image, "size": 0}),
        );
        q.ok("job-dismiss", json!({"id": format!("{id}-file")}));
        q.ok(
            "blockdev-add",
            json!({"driver": "file", "node-name": id, "filename": image}),
        );
        let mut options = json!({"driver": "qcow2", "file": id, "size": 1 << 30});
        options
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        seen.push(create(&mut q, &format!("{id}-fmt"), options));
        seen.push(job(&mut q, &format!("{id}-fmt")));
        seen.push(image_info(Path::new(&image)));
        check_clean(program, Path::new(&image));
    }

    // A file preallocated in full, and sparse grown from one that had data.
    let full = path("full.raw");
    std::fs::write(&full, [0x5au8; 4096]).unwrap();
    seen.push(create(
        &mut q,
        "full",
        json!({"driver": "file", "filename": full, "size": 1 << 20, "preallocation": "full"}),
    ));
    let data = std::fs::read(&full).unwrap();
    assert!(
        data.len() == 1 << 20 && data.iter().all(|&b| b == 0),
        "{program}"
    );
    seen.push(create(
        &mut q,
        "falloc",
        json!({"driver": "file", "filename": path("falloc.raw"), "size": 1 << 20,
               "preallocation": "falloc", "nocow": true}),
    ));
    seen.push(job(&mut q, "falloc"));

    // Refusals of the command.
    seen.push(q.call("job-dismiss", json!({"id": "nosuch"})));
    seen.push(q.call("job-cancel", json!({"id": "nosuch"})));
    let raw = json!({"driver": "file", "filename": path("dup.raw"), "size": 0});
    seen.push(create(&mut q, "dup", raw.clone()));
    seen.push(q.call("blockdev-create", json!({"job-id": "dup", "options": raw})));
    seen.push(q.call("blockdev-create", json!({"job-id": "1bad", "options": raw})));
    seen.push(q.call(
        "blockdev-create",
        json!({"job-id": "rawjob", "options": {"driver": "raw"}}),
    ));
    seen.push(q.call(
        "blockdev-create",
        json!({"job-id": "x", "options": {"driver": "file"}}),
    ));

    // A driver QEMU creates with and this daemon does not: refused, naming the two served.
    if program == OURS {
        let vdi = json!({"driver": "vdi", "file": "more0", "size": 1 << 20});
        let (class, desc) = q.error("blockdev-create", json!({"job-id": "vdi", "options": vdi}));
        assert_eq!(class, "GenericError");
        assert_eq!(
            desc,
            "blockdev-create of driver 'vdi' is not served by this daemon (drivers file and \
             qcow2 are)"
        );
    }

    // Jobs that fail: QEMU's text in query-jobs.
    let missing = json!({"driver": "file", "filename": path("no/such/dir.raw"), "size": 0});
    seen.push(create(&mut q, "missing-dir", missing));
    seen.push(job(&mut q, "missing-dir"));
    let no_node = json!({"driver": "qcow2", "file": "nosuch", "size": 1 << 20});
    seen.push(create(&mut q, "missing-node", no_node));
    seen.push(job(&mut q, "missing-node"));
    for (n, bad) in [
        json!({"version": "v2", "lazy-refcounts": true}),
        json!({"refcount-bits": 3}),
        json!({"cluster-size": 1000}),
        json!({"backing-fmt": "raw"}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut options = json!({"driver": "qcow2", "file": "more0", "size": 1 << 20});
        options
            .as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let id = format!("bad{n}");
        seen.push(create(&mut q, &id, options));
        seen.push(job(&mut q, &id));
        seen.push(q.call("job-cancel", json!({"id": id})));
        q.ok("job-dismiss", json!({"id": id}));
    }
    seen.push(q.ok("query-jobs", json!({})));

    // A dismiss while the job may still run: refused with its state's text until it
    // concluded (when it comes is the daemon's; both answers are QEMU's).
    let big = json!({"driver": "file", "filename": path("big.raw"), "size": 256 << 20,
                     "preallocation": "full"});
    q.ok("blockdev-create", json!({"job-id": "big", "options": big}));
    let reply = q.call("job-dismiss", json!({"id": "big"}));
    if let Some(e) = reply.get("error") {
        let desc = e["desc"].as_str().unwrap();
        assert!(
            desc.starts_with("Job 'big' in state '")
                && desc.ends_with("' cannot accept command verb 'dismiss'")
                && !desc.contains("'concluded'"),
            "{program}: {reply}"
        );
        wait_status(&mut q, "big", "concluded");
        q.ok("job-dismiss", json!({"id": "big"}));
    }
    wait_status(&mut q, "big", "null");

    let dir_text = d.to_str().unwrap().to_string();
    let normal = |v: Value| -> Value {
        serde_json::from_str(&v.to_string().replace(&dir_text, "$DIR")).unwrap()
    };
    let events = q
        .events
        .iter()
        .map(|e| normal(json!({"event": e["event"], "data": e["data"]})))
        .collect();
    (seen.into_iter().map(normal).collect(), events)
}

#[test]
fn blockdev_create_jobs_answer_as_qemu_storage_daemons() {
    let (ours, our_events) = steps(OURS);
    // The life of a job, as QEMU's: a created image, then a failed one.
    let of = |id: &str| -> Vec<Value> {
        our_events
            .iter()
            .filter(|e| e["data"]["id"] == id)
            .map(|e| e["data"]["status"].clone())
            .collect()
    };
    let done = [
        "created",
        "running",
        "waiting",
        "pending",
        "concluded",
        "null",
    ];
    assert_eq!(of("create-file"), done);
    assert_eq!(of("create-fmt"), done);
    assert_eq!(
        of("missing-dir"),
        ["created", "running", "aborting", "concluded"]
    );
    assert!(our_events.iter().all(|e| e["event"] == "JOB_STATUS_CHANGE"));
    if !common::runnable("qemu-storage-daemon") {
        aio_conformance::skip("qemu-storage-daemon is not installed (Debian package qemu-utils)");
        return;
    }
    let (theirs, their_events) = steps("qemu-storage-daemon");
    assert_eq!(ours.len(), theirs.len());
    for (k, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "step {k}: ours {a} / qemu-storage-daemon's {b}");
    }
    assert_eq!(our_events, their_events);
}
