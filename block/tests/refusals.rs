//! Images refused before they are served, by name: encrypted qcow2, other formats probed,
//! backing chains that loop or hide another format, unknown incompatible features (images
//! made by `qemu-img`).

mod common;

use std::path::Path;

use aio_block::format::{ImageFormat, KnownFormat, Qcow2Refusal};
use aio_block::image::{Image, ImageOptions, OpenError};

fn qemu(dir: &Path, tool: &str, args: &[&str]) -> String {
    common::run_in(dir, tool, args)
}

fn refusal(path: &Path, format: ImageFormat) -> OpenError {
    Image::open(path, ImageOptions::new(format)).unwrap_err()
}

#[test]
fn encrypted_and_foreign_images_and_backing_loops_are_refused_by_name() {
    let dir = aio_test_support::images::image_dir("block-test");
    let at = dir.path();
    let secret = ["--object", "secret,id=s0,data=hunter2"];
    let luks_qcow2 = ["-o", "encrypt.format=luks,encrypt.key-secret=s0"];
    let args = [
        &["create", "-q", "-f", "qcow2"][..],
        &secret,
        &luks_qcow2,
        &["enc.qcow2", "1M"],
    ];
    qemu(at, "qemu-img", &args.concat());
    let luks = [
        &["create", "-q", "-f", "luks"][..],
        &secret,
        &["-o", "key-secret=s0"],
    ];
    qemu(
        at,
        "qemu-img",
        &[&luks.concat()[..], &["disk.luks", "1M"]].concat(),
    );
    qemu(
        at,
        "qemu-img",
        &["create", "-q", "-f", "vmdk", "disk.vmdk", "1M"],
    );
    qemu(
        at,
        "qemu-img",
        &["create", "-q", "-f", "raw", "disk.raw", "1M"],
    );

    let e = refusal(&at.join("enc.qcow2"), ImageFormat::Auto);
    assert!(
        matches!(
            &e,
            OpenError::Qcow2Refused {
                reason: Qcow2Refusal::Encrypted(2),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("encrypted"), "{e}");
    let e = refusal(&at.join("disk.luks"), ImageFormat::Auto);
    assert!(
        matches!(
            e,
            OpenError::FormatFound {
                format: KnownFormat::Luks,
                ..
            }
        ),
        "{e}"
    );
    let e = refusal(&at.join("disk.vmdk"), ImageFormat::Auto);
    assert!(
        matches!(
            e,
            OpenError::FormatFound {
                format: KnownFormat::Vmdk,
                ..
            }
        ),
        "{e}"
    );
    let e = refusal(&at.join("disk.raw"), ImageFormat::Qcow2);
    assert!(matches!(e, OpenError::NotQcow2 { found: None, .. }), "{e}");

    // A chain that comes back to its own top.
    qemu(
        at,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "a.qcow2", "1M"],
    );
    let b = [
        "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", "a.qcow2", "b.qcow2",
    ];
    qemu(at, "qemu-img", &b);
    let rebase = ["rebase", "-u", "-F", "qcow2", "-b", "b.qcow2", "a.qcow2"];
    qemu(at, "qemu-img", &rebase);
    let e = refusal(&at.join("b.qcow2"), ImageFormat::Auto);
    assert!(matches!(e, OpenError::BackingLoop { .. }), "{e}");

    // A backing file that is another format, declared raw.
    let over_luks = [
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "raw",
        "-b",
        "disk.luks",
        "c.qcow2",
    ];
    qemu(at, "qemu-img", &over_luks);
    let e = refusal(&at.join("c.qcow2"), ImageFormat::Auto);
    assert!(
        matches!(
            e,
            OpenError::BackingFormat {
                format: KnownFormat::Luks,
                ..
            }
        ),
        "{e}"
    );

    // An incompatible feature bit the device does not serve (bit 9, unknown to QEMU too).
    qemu(
        at,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "odd.qcow2", "1M"],
    );
    let mut bytes = std::fs::read(at.join("odd.qcow2")).unwrap();
    bytes[72..80].copy_from_slice(&(1u64 << 9).to_be_bytes());
    std::fs::write(at.join("odd.qcow2"), bytes).unwrap();
    let e = refusal(&at.join("odd.qcow2"), ImageFormat::Auto);
    assert!(
        matches!(
            e,
            OpenError::Qcow2Refused {
                reason: Qcow2Refusal::Incompatible(0x200),
                ..
            }
        ),
        "{e}"
    );
}
