//! An image whose lock another process holds at start: a predecessor still letting it go.
//!
//! This module owns the two cases where a daemon starts before the image's previous user has
//! gone, and nothing else (the locks are `aio_block::lock`'s, the inactive disk
//! `aio_virtio_blk`'s):
//!
//! * **A killed daemon's locks** go with its files, which the kernel may still hold for a
//!   moment after the process is gone (its io_uring or AIO requests finishing): a conflict is
//!   tried again for [`KILLED_HOLDER_GRACE`] before it refuses the disk.
//! * **An upgrade**: a new daemon started on the socket path a running daemon serves (the old
//!   one is stopped once the new one listens). The image's lock is the old daemon's until it
//!   has drained, so the image is opened inactive (a qcow2 image read-only, unlocked) and its
//!   locks taken when the first frontend connects (QEMU reconnects once the old daemon has
//!   closed its connection), a qcow2 image's metadata then read afresh (`aio_block`'s
//!   `Image::activate`).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use aio_block::image::OpenError;
use aio_block::lock::LockError;
use aio_virtio_blk::device::{BlockDevice, DeviceError, DiskOptions};

use super::config::DiskSpec;

/// How long a conflicting lock is retried at start (a killed holder's files closing).
pub const KILLED_HOLDER_GRACE: Duration = Duration::from_secs(2);

fn conflict(e: &DeviceError) -> bool {
    matches!(
        e,
        DeviceError::Image(OpenError::Lock(LockError::Conflict { .. }))
    )
}

/// Whether a daemon serves `socket` now (it accepts a connection: the probe is closed at
/// once, and read by that daemon as a frontend that went).
fn served_by_another(socket: &Path) -> bool {
    UnixStream::connect(socket).is_ok()
}

/// Opens disk `d`'s image with its locks; on a conflict, waits out a killed holder, and opens
/// the image inactive when a running daemon serves the disk's socket (an upgrade).
pub(super) fn open_image(d: &DiskSpec, options: DiskOptions) -> Result<BlockDevice, DeviceError> {
    let deadline = Instant::now() + KILLED_HOLDER_GRACE;
    loop {
        match BlockDevice::open(&d.image, options.clone()) {
            Err(e) if conflict(&e) && served_by_another(&d.socket) => {
                return match BlockDevice::open_inactive(&d.image, options) {
                    Ok(device) => {
                        eprintln!(
                            "aio-storage-daemon: {}: the daemon serving {} uses the image: its \
                             lock is taken when the first frontend connects (an upgrade)",
                            d.image.display(),
                            d.socket.display()
                        );
                        Ok(device)
                    }
                    Err(DeviceError::Image(OpenError::NotInactive { .. })) => Err(e),
                    Err(other) => Err(other),
                };
            }
            Err(e) if conflict(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            result => return result,
        }
    }
}
