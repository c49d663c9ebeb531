//! The steps the dirty-bitmap tests share (`persistent_bitmaps`, `durable_bitmaps`,
//! `inactive`): QEMU's tools present, a bitmap's dirty ranges, what `qemu-img info` says of
//! an image's bitmaps, writes through a session.

use std::path::Path;
use std::sync::Arc;

use aio_block::bitmap::DirtyBitmap;
use aio_block::Image;
use aio_test_support::tool::run_in;

use super::session::Session;

/// Whether every one of `tools` (QEMU's) is here; says loudly which is not.
pub fn have(tools: &[&str]) -> bool {
    for tool in tools {
        if !aio_test_support::tool::installed(tool) {
            aio_conformance::skip(&format!(
                "{tool} is not installed (Debian package qemu-utils)"
            ));
            return false;
        }
    }
    true
}

/// The dirty extents of `b`, as `(offset, len)`.
pub fn dirty(b: &DirtyBitmap) -> Vec<(u64, u64)> {
    b.extents(0, b.size())
        .into_iter()
        .filter(|e| e.2)
        .map(|e| (e.0, e.1))
        .collect()
}

/// `qemu-img info --output=json`'s bitmaps of image `name` in `dir` (`-U`: whatever holds
/// its lock).
pub fn qemu_bitmaps(dir: &Path, name: &str) -> Vec<serde_json::Value> {
    let out = run_in(dir, "qemu-img", &["info", "-U", "--output=json", name]);
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Writes 7s at each `(offset, len)` through a session on `image`, then ends the session.
pub fn write_through(image: &Arc<Image>, writes: &[(u64, usize)]) {
    let (_, engine) = super::engines().into_iter().next().unwrap();
    let s = Session::new(image, engine);
    for &(offset, len) in writes {
        s.write(offset, &vec![7u8; len], false).unwrap();
    }
}

/// The dirty ranges a crash leaves of `ranges` written at `granularity` on a disk of `size`
/// bytes: each widened to whole runs of 64 granules (what a kept bitmap makes durable at
/// once, `qcow2/durable.rs`), neighbours joined.
pub fn widened(ranges: &[(u64, u64)], granularity: u64, size: u64) -> Vec<(u64, u64)> {
    let run = granularity * 64;
    joined(
        ranges
            .iter()
            .map(|&(offset, len)| {
                let start = offset / run * run;
                let end = (offset + len).div_ceil(run) * run;
                (start, end.min(size) - start)
            })
            .collect(),
    )
}

/// `ranges` sorted, overlapping and touching ones joined.
pub fn joined(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (offset, len) in ranges {
        match out.last_mut() {
            Some(last) if last.0 + last.1 >= offset => {
                last.1 = last.1.max(offset + len - last.0);
            }
            _ => out.push((offset, len)),
        }
    }
    out
}
