//! Opening one `--disk`: its device's options, its image (a file, a block device, an RBD
//! image, or the null device), and what the log says of it (a dirty qcow2 image, dirty
//! bitmaps marked in use, a backing chain).
//!
//! This module owns the order of an open; the image's own rules are `aio_block`'s, an
//! upgrade's hand-over `handoff`'s, RBD names `rbd`'s.

use std::sync::Arc;

use aio_virtio_blk::device::{BlockDevice, DeviceError, DiskOptions};

use super::config::DiskSpec;
use super::error::DaemonError;
use super::{handoff, rbd};

/// What the device of `d` is made with.
pub(super) fn disk_options(d: &DiskSpec) -> DiskOptions {
    DiskOptions {
        read_only: d.read_only,
        serial: d.serial.clone(),
        queues: d.queues,
        format: d.format,
        locking: d.locking,
        share_rw: d.share_rw,
    }
}

/// Opens one `--disk`'s image (or makes the null device), logging a qcow2 image's backing
/// chain.
pub(super) fn open_disk(d: &DiskSpec) -> Result<BlockDevice, DaemonError> {
    let options = disk_options(d);
    let device = match d.size {
        Some(size) if d.is_null() => BlockDevice::null(size, options),
        // A migration's destination (QEMU's `active=off`): no lock until activated.
        _ if d.inactive || rbd::is_rbd(&d.image) => {
            rbd::open_image(&d.image, options.image_options(), d.inactive)
                .map_err(DeviceError::Image)
                .and_then(|image| BlockDevice::on_image(Arc::new(image), options))
        }
        _ => handoff::open_image(d, options).inspect(|device| {
            rbd::warn_of_bitmaps(&d.image, device.image());
        }),
    }
    .map_err(|e| DaemonError::Disk {
        spec: d.label(),
        source: e.into(),
    })?;
    if device.is_dirty() {
        eprintln!(
            "aio-storage-daemon: warning: {}: the qcow2 image is dirty (its refcounts are stale \
             after a crash with lazy_refcounts=on): served read-only; `qemu-img check -r all {}` \
             repairs it, then it is served writable",
            d.image.display(),
            d.image.display()
        );
    }
    let chain = device.backing_chain();
    if !chain.is_empty() {
        let names: Vec<_> = chain.iter().map(|p| p.display().to_string()).collect();
        eprintln!(
            "aio-storage-daemon: {}: {} image, backing chain {}",
            d.image.display(),
            device.format_name(),
            names.join(" <- ")
        );
    }
    Ok(device)
}
