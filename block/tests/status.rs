//! Block status of a raw image against `qemu-img map` of the same file: the same ranges of
//! data and holes. Needs `qemu-img` and `qemu-io` (Debian's `qemu-utils`; `.ci/run` installs it).

use std::path::Path;
use std::process::Command;

use aio_block::status::{raw_extents, Extent, ExtentKind};

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (install qemu-utils)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `qemu-img map`'s answer as extents, neighbours of one kind merged.
fn qemu_map(image: &Path) -> Vec<Extent> {
    let json = run(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", image.to_str().unwrap()],
    );
    let entries: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut out: Vec<Extent> = Vec::new();
    for e in entries.as_array().unwrap() {
        let (offset, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        let kind = match e["data"].as_bool().unwrap() {
            true => ExtentKind::Data,
            false => ExtentKind::Hole,
        };
        match out.last_mut() {
            Some(last) if last.kind == kind => last.len += len,
            _ => out.push(Extent { offset, len, kind }),
        }
    }
    out
}

#[test]
fn a_raw_images_extents_are_qemu_img_maps() {
    let dir = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .unwrap();
    let image = dir.path().join("sparse.raw");
    let i = image.to_str().unwrap();
    run("qemu-img", &["create", "-q", "-f", "raw", i, "64M"]);
    for (at, len) in [("1M", "512k"), ("8M", "4k"), ("40M", "3M"), ("63M", "1M")] {
        let write = format!("write -P 0x5a {at} {len}");
        run("qemu-io", &["-f", "raw", "-c", &write, i]);
    }
    let file = std::fs::File::open(&image).unwrap();
    let ours = raw_extents(&file, 64 << 20, 0, 64 << 20).unwrap();
    assert_eq!(ours, qemu_map(&image));
    assert!(
        ours.iter().any(|e| e.kind == ExtentKind::Hole),
        "the file system kept holes: {ours:?}"
    );
}
