//! Disks that would collide: two on one socket, or one image served twice with a writer.
//!
//! This module owns that check, made before any image is opened or socket bound; it serves
//! nothing. Without it the second disk on a socket is unreachable (the first binds it) and
//! two writers of one image corrupt each other's view of it, and neither is said anywhere.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::config::DiskSpec;
use super::error::DaemonError;

/// Where a socket path leads: the canonical directory and the file name (the socket itself
/// may not exist yet, or be a stale one that serving replaces).
fn socket_key(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (absolute.parent(), absolute.file_name()) {
        (Some(dir), Some(name)) => match dir.canonicalize() {
            Ok(dir) => dir.join(name),
            Err(_) => absolute.clone(),
        },
        _ => absolute,
    }
}

/// What an image is, whatever path names it: a block device by its device number (a node
/// and its `/dev/disk/by-*` links are one device), any other file by its inode. None when
/// it cannot be looked at: opening it fails later, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ImageKey {
    BlockDevice(u64),
    File {
        dev: u64,
        ino: u64,
    },
    /// An RBD image, by `pool[/namespace]/image[@snapshot]` (whatever options reach it).
    Rbd(String),
}

pub(super) fn image_key(path: &Path) -> Option<ImageKey> {
    if super::rbd::is_rbd(path) {
        return super::rbd::image_key(path).map(ImageKey::Rbd);
    }
    let meta = std::fs::metadata(path).ok()?;
    Some(if meta.file_type().is_block_device() {
        ImageKey::BlockDevice(meta.rdev())
    } else {
        ImageKey::File {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    })
}

/// Refuses two disks on one socket, and an image given twice unless every disk serving it is
/// read-only; the error names both `--disk` arguments.
pub(super) fn check(disks: &[DiskSpec]) -> Result<(), DaemonError> {
    let sockets: Vec<PathBuf> = disks.iter().map(|d| socket_key(&d.socket)).collect();
    let images: Vec<Option<ImageKey>> = disks
        .iter()
        .map(|d| {
            if d.is_null() {
                None
            } else {
                image_key(&d.image)
            }
        })
        .collect();
    for (j, second) in disks.iter().enumerate() {
        for (i, first) in disks[..j].iter().enumerate() {
            let conflict = |reason: String| DaemonError::Conflict {
                first: first.to_string(),
                second: second.to_string(),
                reason,
            };
            if sockets[i] == sockets[j] {
                return Err(conflict(format!(
                    "both on socket {}: a socket serves one disk",
                    second.socket.display()
                )));
            }
            let same_image = images[i].is_some() && images[i] == images[j];
            if same_image && !(first.read_only && second.read_only) {
                return Err(conflict(format!(
                    "both serve image {}, and not both read-only: two writers of one image \
                     corrupt it (give each disk its own image, or readonly=on to both)",
                    second.image.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(spec: &str) -> DiskSpec {
        spec.parse().unwrap()
    }

    fn refused(disks: &[DiskSpec]) -> String {
        let e = check(disks).unwrap_err();
        assert!(matches!(e, DaemonError::Conflict { .. }), "{e}");
        e.to_string()
    }

    #[test]
    fn two_disks_on_one_socket_are_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, [0; 512]).unwrap();
        std::fs::write(&b, [0; 512]).unwrap();
        let s = dir.path().join("s.sock");
        let first = disk(&format!("socket={},image={}", s.display(), a.display()));
        // The same socket by another spelling of its directory.
        let other_spelling = dir.path().join(".").join("s.sock");
        let second = disk(&format!(
            "socket={},image={}",
            other_spelling.display(),
            b.display()
        ));
        let e = refused(&[first.clone(), second.clone()]);
        assert!(e.contains(&format!("--disk {first}")), "{e}");
        assert!(e.contains(&format!("--disk {second}")), "{e}");
        assert!(e.contains("socket"), "{e}");
        let apart = disk(&format!(
            "socket={},image={}",
            dir.path().join("t.sock").display(),
            b.display()
        ));
        check(&[first, apart]).unwrap();
    }

    #[test]
    fn one_image_twice_is_refused_unless_both_are_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, [0; 512]).unwrap();
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&image, &link).unwrap();
        let on = |sock: &str, path: &Path, ro: bool| {
            let ro = if ro { ",readonly=on" } else { "" };
            disk(&format!(
                "socket={},image={}{ro}",
                dir.path().join(sock).display(),
                path.display()
            ))
        };
        for (ro1, ro2) in [(false, false), (true, false), (false, true)] {
            // Through a symlink it is the same file.
            let (first, second) = (on("1", &image, ro1), on("2", &link, ro2));
            let e = refused(&[first.clone(), second.clone()]);
            assert!(
                e.contains(&format!("--disk {first} and --disk {second}")),
                "{e}"
            );
            assert!(e.contains("read-only"), "{e}");
        }
        check(&[on("1", &image, true), on("2", &link, true)]).unwrap();
        // A missing image is not a collision: opening it says what is wrong.
        let missing = dir.path().join("missing");
        check(&[on("1", &missing, false), on("2", &missing, false)]).unwrap();
    }
}
