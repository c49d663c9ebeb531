//! Persistent dirty bitmaps in qcow2, checked against QEMU's own tools: bitmaps `qemu-img
//! bitmap` made and `qemu-io` dirtied load with their granularity, recording state and bits;
//! a bitmap aio-block adds and dirties is stored at a clean close where `qemu-img` finds it
//! (flag `auto`, not `in-use`, `check` clean, its bits copied by `qemu-img convert --bitmaps`
//! and dirtied further by `qemu-io`); a removed one leaves the file. What a crash leaves is
//! `durable_bitmaps.rs`'s.
#![cfg(feature = "qcow2")]

mod common;

use std::path::Path;
use std::sync::Arc;

use aio_block::bitmap::BitmapOptions;
use aio_block::{Image, ImageOptions};
use aio_test_support::tool::run_in;
use common::bitmaps::{dirty, have, qemu_bitmaps, write_through};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// A 4 MiB qcow2 image `name` in `dir` (64 KiB clusters).
fn create(dir: &Path, name: &str) {
    run_in(
        dir,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", name, "4M"],
    );
}

#[test]
fn bitmaps_qemu_made_and_dirtied_load_with_their_granularity_state_and_bits() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-pbitmaps");
    let d = dir.path();
    create(d, "d.qcow2");
    run_in(
        d,
        "qemu-img",
        &["bitmap", "--add", "-g", "64k", "d.qcow2", "on"],
    );
    run_in(
        d,
        "qemu-img",
        &["bitmap", "--add", "-g", "128k", "d.qcow2", "off"],
    );
    run_in(d, "qemu-img", &["bitmap", "--disable", "d.qcow2", "off"]);
    // qemu-io loads the bitmaps, dirties the enabled one and stores it again.
    let io = [
        "-f",
        "qcow2",
        "-c",
        "write -P 1 1M 64k",
        "-c",
        "write 3M 4k",
    ];
    run_in(d, "qemu-io", &[&io[..], &["d.qcow2"]].concat());
    let image = Image::open(&d.join("d.qcow2"), ImageOptions::default().read_only(true)).unwrap();
    let on = image.dirty_bitmaps().find("on").unwrap();
    let off = image.dirty_bitmaps().find("off").unwrap();
    assert_eq!((on.granularity(), off.granularity()), (65536, 131072));
    assert!(on.is_persistent() && on.is_recording() && !on.is_inconsistent());
    assert!(off.is_persistent() && !off.is_recording() && !off.is_inconsistent());
    assert_eq!(dirty(&on), vec![(MIB, 64 * KIB), (3 * MIB, 64 * KIB)]);
    assert_eq!(on.count(), 128 * KIB);
    assert_eq!(off.count(), 0);
}

#[test]
fn a_persistent_bitmap_is_stored_at_a_clean_close_where_qemu_reads_its_bits() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-pbitmaps");
    let d = dir.path();
    create(d, "d.qcow2");
    let path = d.join("d.qcow2");
    {
        let image = Arc::new(Image::open(&path, ImageOptions::default()).unwrap());
        let p = image
            .add_dirty_bitmap(
                "p",
                BitmapOptions::new().granularity(64 << 10).persistent(true),
            )
            .unwrap();
        write_through(&image, &[(MIB, 4096), (2 * MIB + 60 * KIB, 8192)]);
        assert_eq!(dirty(&p), vec![(MIB, 64 * KIB), (2 * MIB, 128 * KIB)]);
        image.close().unwrap();
    }
    let bitmaps = qemu_bitmaps(d, "d.qcow2");
    assert_eq!(bitmaps.len(), 1, "{bitmaps:?}");
    assert_eq!(bitmaps[0]["name"], "p");
    assert_eq!(bitmaps[0]["granularity"], 65536);
    assert_eq!(bitmaps[0]["flags"], serde_json::json!(["auto"]));
    run_in(d, "qemu-img", &["check", "-q", "d.qcow2"]);

    // QEMU reads the bits: convert copies them, qemu-io dirties them further.
    run_in(
        d,
        "qemu-img",
        &[
            "convert",
            "-q",
            "--bitmaps",
            "-O",
            "qcow2",
            "d.qcow2",
            "e.qcow2",
        ],
    );
    let io = ["-f", "qcow2", "-c", "write 3M 4k", "d.qcow2"];
    run_in(d, "qemu-io", &io);
    run_in(d, "qemu-img", &["check", "-q", "d.qcow2"]);
    let ro = ImageOptions::default().read_only(true);
    let copy = Image::open(&d.join("e.qcow2"), ro.clone()).unwrap();
    let p = copy.dirty_bitmaps().find("p").unwrap();
    assert_eq!(dirty(&p), vec![(MIB, 64 * KIB), (2 * MIB, 128 * KIB)]);
    let again = Image::open(&path, ro).unwrap();
    let p = again.dirty_bitmaps().find("p").unwrap();
    assert!(p.is_recording() && !p.is_inconsistent());
    assert_eq!(
        dirty(&p),
        vec![(MIB, 64 * KIB), (2 * MIB, 128 * KIB), (3 * MIB, 64 * KIB)]
    );
}

#[test]
fn a_removed_bitmap_leaves_the_file_at_the_clean_close() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-pbitmaps");
    let d = dir.path();
    create(d, "d.qcow2");
    run_in(d, "qemu-img", &["bitmap", "--add", "d.qcow2", "gone"]);
    run_in(d, "qemu-img", &["bitmap", "--add", "d.qcow2", "kept"]);
    {
        let image = Image::open(&d.join("d.qcow2"), ImageOptions::default()).unwrap();
        image.dirty_bitmaps().remove("gone").unwrap();
        image.close().unwrap();
    }
    let bitmaps = qemu_bitmaps(d, "d.qcow2");
    let names: Vec<&str> = bitmaps
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["kept"]);
    assert_eq!(bitmaps[0]["flags"], serde_json::json!(["auto"]));
    run_in(d, "qemu-img", &["check", "-q", "d.qcow2"]);
}

#[test]
fn persistent_bitmaps_are_refused_where_they_cannot_be_stored() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-pbitmaps");
    let d = dir.path();
    create(d, "d.qcow2");
    let ro = ImageOptions::default().read_only(true);
    let image = Image::open(&d.join("d.qcow2"), ro).unwrap();
    let e = image
        .add_dirty_bitmap("p", BitmapOptions::new().persistent(true))
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("Can't store persistent bitmaps to"),
        "{e}"
    );
    drop(image);
    let image = Image::open(&d.join("d.qcow2"), ImageOptions::default()).unwrap();
    image
        .add_dirty_bitmap("p", BitmapOptions::new().persistent(true))
        .unwrap();
}

#[test]
fn a_backing_files_bitmap_is_read_down_the_chain_read_only() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = aio_test_support::images::image_dir("block-pbitmaps");
    let d = dir.path();
    // base (bitmap `deep`) <- mid (bitmap `near`, and a `deep` of its own) <- top.
    create(d, "base.qcow2");
    run_in(d, "qemu-img", &["bitmap", "--add", "base.qcow2", "deep"]);
    run_in(
        d,
        "qemu-io",
        &["-f", "qcow2", "-c", "write 1M 64k", "base.qcow2"],
    );
    let overlay = |name: &str, backing: &str| {
        run_in(
            d,
            "qemu-img",
            &[
                "create", "-q", "-f", "qcow2", "-b", backing, "-F", "qcow2", name,
            ],
        );
    };
    overlay("mid.qcow2", "base.qcow2");
    run_in(d, "qemu-img", &["bitmap", "--add", "mid.qcow2", "near"]);
    run_in(
        d,
        "qemu-io",
        &["-f", "qcow2", "-c", "write 2M 4k", "mid.qcow2"],
    );
    overlay("top.qcow2", "mid.qcow2");
    let top = Arc::new(Image::open(&d.join("top.qcow2"), ImageOptions::default()).unwrap());
    assert!(
        top.dirty_bitmaps().find("near").is_err(),
        "not the top's own"
    );
    let near = top
        .backing_file_bitmap("near")
        .unwrap()
        .expect("mid's bitmap");
    assert!(near.is_persistent() && near.is_read_only() && near.is_recording());
    assert_eq!(dirty(&near), vec![(2 * MIB, 64 * KIB)]);
    let deep = top
        .backing_file_bitmap("deep")
        .unwrap()
        .expect("base's bitmap");
    assert_eq!(dirty(&deep), vec![(MIB, 64 * KIB)]);
    assert!(top.backing_file_bitmap("none").unwrap().is_none());
    // Writes to the top dirty nothing below.
    write_through(&top, &[(2 * MIB, 4096)]);
    assert_eq!(
        dirty(&top.backing_file_bitmap("deep").unwrap().unwrap()),
        vec![(MIB, 64 * KIB)]
    );
    drop(top);
    run_in(d, "qemu-img", &["check", "-q", "base.qcow2"]);
}
