//! Persistent dirty bitmaps kept consistent in a writable qcow2 image while it is open, so
//! that an image lost without a clean close (what a SIGKILL leaves: nothing stored, nothing
//! flushed; here the image is leaked in process, `storage-daemon/tests/crash_bitmaps.rs`
//! kills a daemon) still has every bitmap consistent (`qemu-img info` shows no `in-use`,
//! `qemu-img check` is clean) with every written granule set (in its run of 64), over several bitmap data
//! clusters; a clear keeps the superset on disk until the clean close, which stores exactly
//! the bits in memory; bitmaps added while open (one removed and added again) and merged
//! into are kept too, a disabled one with the writes made meanwhile (a superset); a resize
//! marks them in use.
#![cfg(feature = "qcow2")]

mod common;

use std::path::Path;
use std::sync::Arc;

use aio_block::bitmap::BitmapOptions;
use aio_block::lock::LockMode;
use aio_block::{Image, ImageOptions};
use aio_test_support::tool::run_in;
use common::bitmaps::{dirty, have, joined, qemu_bitmaps, widened, write_through};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// A 64 MiB qcow2 image `d.qcow2` in `dir` with 4 KiB clusters (one bitmap data cluster holds
/// 32768 granules: 16 MiB of disk at 512-byte granules), and bitmap `b` of `granularity`.
fn create(dir: &Path, granularity: &str) -> std::path::PathBuf {
    run_in(
        dir,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            "cluster_size=4k",
            "d.qcow2",
            "64M",
        ],
    );
    run_in(
        dir,
        "qemu-img",
        &["bitmap", "--add", "-g", granularity, "d.qcow2", "b"],
    );
    dir.join("d.qcow2")
}

/// The flags `qemu-img info` shows for bitmap `name`.
fn flags(dir: &Path, name: &str) -> serde_json::Value {
    let bitmaps = qemu_bitmaps(dir, "d.qcow2");
    let b = bitmaps.iter().find(|b| b["name"] == name);
    b.unwrap_or_else(|| panic!("no bitmap {name} in {bitmaps:?}"))["flags"].clone()
}

/// What a SIGKILL leaves of `image`: nothing stored, nothing flushed, nothing closed.
fn lose(image: Arc<Image>) {
    std::mem::forget(image);
}

/// The image at `path` opened again read-only, unlocked (the lost one still holds its locks).
fn reopen(path: &Path) -> Image {
    let opts = ImageOptions::default()
        .read_only(true)
        .locking(LockMode::Off);
    Image::open(path, opts).unwrap()
}

#[test]
fn a_lost_image_leaves_its_bitmap_consistent_with_every_write_over_several_clusters() {
    if !have(&["qemu-img"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-dbitmaps");
    let d = dir.path();
    let path = create(d, "512");
    let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
    assert!(image.bitmaps_marked_inconsistent().is_empty());
    // Chunks 0, 2 and 3 (16 MiB each); one write across the boundary of chunks 2 and 3.
    let writes = [
        (MIB + 512, 1024),
        (48 * MIB - 512, 1024),
        (63 * MIB, 4096),
        (MIB + 4096, 512),
    ];
    write_through(&image, &writes);
    lose(image);
    assert_eq!(flags(d, "b"), serde_json::json!(["auto"]));
    run_in(d, "qemu-img", &["check", "-q", "-U", "d.qcow2"]);
    let again = reopen(&path);
    let b = again.dirty_bitmaps().find("b").unwrap();
    assert!(!b.is_inconsistent() && b.is_recording());
    // Every written granule, widened to its run of 64 (32 KiB at 512-byte granules).
    let written: Vec<(u64, u64)> = writes.iter().map(|&(o, l)| (o, l as u64)).collect();
    assert_eq!(dirty(&b), widened(&written, 512, 64 * MIB));
    assert_eq!(
        dirty(&b),
        vec![
            (MIB, 32 * KIB),
            (48 * MIB - 32 * KIB, 64 * KIB),
            (63 * MIB, 32 * KIB)
        ]
    );
}

#[test]
fn a_clear_keeps_the_superset_on_disk_until_the_clean_close_stores_the_bits_exactly() {
    if !have(&["qemu-img"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-dbitmaps");
    let d = dir.path();
    let path = create(d, "64k");
    // Lost after a clear: the bits from before it stay on disk (a superset).
    let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
    write_through(&image, &[(MIB, 4096)]);
    let b = image.dirty_bitmaps().find("b").unwrap();
    b.clear();
    write_through(&image, &[(5 * MIB, 4096)]);
    assert_eq!(dirty(&b), vec![(5 * MIB, 64 * KIB)]);
    lose(image);
    let again = reopen(&path);
    let lost = again.dirty_bitmaps().find("b").unwrap();
    // Both writes, each widened to its run (64 granules of 64 KiB: 4 MiB).
    assert_eq!(
        dirty(&lost),
        widened(&[(MIB, 4096), (5 * MIB, 4096)], 64 * KIB, 64 * MIB)
    );
    drop(again);

    // Closed cleanly after a clear: exactly the bits in memory.
    let unlocked = ImageOptions::default().locking(LockMode::Off);
    let image = Arc::new(Image::open(&path, unlocked).unwrap());
    let b = image.dirty_bitmaps().find("b").unwrap();
    b.clear();
    write_through(&image, &[(9 * MIB, 4096)]);
    image.close().unwrap();
    drop(image);
    assert_eq!(flags(d, "b"), serde_json::json!(["auto"]));
    // -U: the lost image still holds its locks.
    run_in(d, "qemu-img", &["check", "-q", "-U", "d.qcow2"]);
    let again = reopen(&path);
    let b = again.dirty_bitmaps().find("b").unwrap();
    assert_eq!(dirty(&b), vec![(9 * MIB, 64 * KIB)]);
}

#[test]
fn bitmaps_added_while_open_and_merged_into_survive_a_loss() {
    if !have(&["qemu-img"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-dbitmaps");
    let d = dir.path();
    let path = create(d, "64k");
    let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
    let persistent = BitmapOptions::new().persistent(true);
    // The image's default granularity: its cluster size, 4 KiB.
    let n = image.add_dirty_bitmap("n", persistent).unwrap();
    // On disk at once, consistent and empty.
    assert_eq!(flags(d, "n"), serde_json::json!(["auto"]));
    write_through(&image, &[(2 * MIB, 512), (40 * MIB, 64 << 10)]);
    let m = image
        .add_dirty_bitmap("m", persistent.granularity(64 << 10).disabled(true))
        .unwrap();
    m.merge_from(&n).unwrap();
    // Removed and added again: the new one is kept, the old one's clusters (freed) never
    // written again (`qemu-img check` below).
    let r = image.add_dirty_bitmap("r", persistent).unwrap();
    write_through(&image, &[(8 * MIB, 512)]);
    image.dirty_bitmaps().remove("r").unwrap();
    drop(r);
    image.add_dirty_bitmap("r", persistent).unwrap();
    write_through(&image, &[(12 * MIB, 512), (8 * MIB, 512)]);
    let t = image.add_dirty_bitmap("t", BitmapOptions::new()).unwrap();
    assert_eq!(dirty(&t), vec![]);
    lose(image);
    assert_eq!(flags(d, "m"), serde_json::json!([]));
    run_in(d, "qemu-img", &["check", "-q", "-U", "d.qcow2"]);
    let again = reopen(&path);
    assert!(again.dirty_bitmaps().get("t").is_none(), "transient");
    let n = again.dirty_bitmaps().find("n").unwrap();
    let n_writes = [
        (2 * MIB, 512),
        (40 * MIB, 64 * KIB),
        (8 * MIB, 512),
        (12 * MIB, 512),
    ];
    assert_eq!(dirty(&n), widened(&n_writes, 4 * KIB, 64 * MIB));
    let r = again.dirty_bitmaps().find("r").unwrap();
    assert_eq!(
        dirty(&r),
        widened(&[(8 * MIB, 512), (12 * MIB, 512)], 4 * KIB, 64 * MIB)
    );
    let m = again.dirty_bitmaps().find("m").unwrap();
    assert!(!m.is_recording() && !m.is_inconsistent());
    // The merged bits exactly (a merge is written as it is), and (a superset, as the disk of
    // a kept bitmap has every write) those of the writes made while it was disabled, widened.
    let merged = [(2 * MIB, 64 * KIB), (40 * MIB, 64 * KIB)];
    let later = widened(&[(8 * MIB, 512), (12 * MIB, 512)], 64 * KIB, 64 * MIB);
    assert_eq!(dirty(&m), joined([&merged[..], &later[..]].concat()));
}

#[test]
fn a_resize_leaves_the_bitmaps_in_use_until_the_clean_close() {
    if !have(&["qemu-img"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-dbitmaps");
    let d = dir.path();
    let path = create(d, "64k");
    let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
    write_through(&image, &[(MIB, 4096)]);
    image.resize(128 * MIB).unwrap();
    assert_eq!(flags(d, "b"), serde_json::json!(["in-use", "auto"]));
    write_through(&image, &[(100 * MIB, 4096)]);
    image.close().unwrap();
    drop(image);
    assert_eq!(flags(d, "b"), serde_json::json!(["auto"]));
    run_in(d, "qemu-img", &["check", "-q", "d.qcow2"]);
    let again = reopen(&path);
    let b = again.dirty_bitmaps().find("b").unwrap();
    assert_eq!(dirty(&b), vec![(MIB, 64 * KIB), (100 * MIB, 64 * KIB)]);
}

/// A kept bitmap removed from the image's set, the last one there, still gets every write on
/// disk until the clean close: lost meanwhile, the image brings it back with the write (a
/// superset of what it held), never without it.
#[test]
fn a_removed_bitmap_still_gets_every_write_on_disk_until_the_clean_close() {
    if !have(&["qemu-img"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-dbitmaps");
    let d = dir.path();
    let path = create(d, "64k");
    let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
    image.dirty_bitmaps().remove("b").unwrap();
    assert!(image.dirty_bitmaps().is_empty());
    write_through(&image, &[(20 * MIB, 4096)]);
    lose(image);
    assert_eq!(flags(d, "b"), serde_json::json!(["auto"]));
    let again = reopen(&path);
    let b = again.dirty_bitmaps().find("b").unwrap();
    assert_eq!(dirty(&b), widened(&[(20 * MIB, 4096)], 64 * KIB, 64 * MIB));
}
