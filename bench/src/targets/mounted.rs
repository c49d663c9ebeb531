//! Refusing to write over a block device that is in use: mounted, holding a mounted partition,
//! taken by device-mapper, or swap, as fio refuses ("appears mounted, and
//! 'allow_mounted_write' isn't set").
//!
//! This module owns that check only. It reads `/proc/self/mountinfo`, `/proc/swaps` and
//! `/sys/dev/block`; it never opens the device for writing.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Why writing to `path` is refused, or `None` when it is not a block device in use (a regular
/// file, a directory, an idle device). `option` names the override in the message.
pub fn in_use(path: &Path, option: &str) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    // The device and its partitions (`/sys/dev/block/M:m/<name>N/dev`).
    let mut devices = vec![format!("{major}:{minor}")];
    let sys = format!("/sys/dev/block/{major}:{minor}");
    if let Ok(entries) = std::fs::read_dir(&sys) {
        for e in entries.flatten() {
            if let Ok(dev) = std::fs::read_to_string(e.path().join("dev")) {
                devices.push(dev.trim().to_string());
            }
        }
    }
    let why = |what: String| {
        Some(format!(
            "{} {what}: writing to it would corrupt it; refused ({option}=1 overrides, as fio's \
             allow_mounted_write does)",
            path.display()
        ))
    };
    // mountinfo's third field is the mounted device's major:minor.
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        for line in info.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if let (Some(dev), Some(at)) = (fields.get(2), fields.get(4)) {
                if devices.iter().any(|d| d == dev) {
                    return why(format!("(or a partition of it, {dev}) is mounted at {at}"));
                }
            }
        }
    }
    // Device-mapper (and md) take a device by becoming its holder.
    let holders = std::fs::read_dir(format!("{sys}/holders"))
        .map(|d| d.count())
        .unwrap_or(0);
    if holders > 0 {
        return why("is held by device-mapper or md (/sys/dev/block/…/holders)".into());
    }
    if let Ok(swaps) = std::fs::read_to_string("/proc/swaps") {
        for line in swaps.lines().skip(1) {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            let same = std::fs::metadata(name)
                .map(|m| m.file_type().is_block_device() && m.rdev() == rdev)
                .unwrap_or(false);
            if same {
                return why("is in use as swap".into());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_idle_things_are_not_in_use() {
        assert_eq!(in_use(Path::new("/etc/hostname"), "x"), None);
        assert_eq!(in_use(Path::new("/nonexistent/aio-bench"), "x"), None);
        assert_eq!(in_use(&std::env::temp_dir(), "x"), None);
    }
}
