//! # aio-block
//!
//! The block layer of aio-rs, as QEMU's `block/` is under its exports: what belongs to an
//! image whatever serves it (a virtio-blk device, vhost-user, NBD), and nothing of any
//! transport. It depends on no virtio, vhost, command-line or signal crate (`cargo tree -p
//! aio-block` shows it).
//!
//! * [`format`](mod@format): an image's format from its first bytes, as QEMU's probe tells it
//!   (`format=auto|raw|qcow2`), and the checks of a qcow2 header made before it is opened
//!   (encrypted images and unknown incompatible features refused).
//! * [`status`]: block status, which ranges of an image hold data and which are holes that
//!   read as zeros (a raw file's from `SEEK_DATA` / `SEEK_HOLE`), as `qemu-img map` and NBD's
//!   `base:allocation` report it.
//! * [`lock`]: image locks QEMU's tools honour: OFD locks on the bytes QEMU's `file-posix`
//!   driver uses (100 + each permission held, 200 + each permission not shared), taken and
//!   checked when an image is opened, released when its holder goes; `locking=auto|on|off`.
//!
//! The images themselves (raw files and block devices, qcow2 through `imago`, the null
//! device) and their request path are served by `aio-virtio-blk` today and move here next.
//!
//! ```no_run
//! use aio_block::lock::{Access, ImageLock, LockMode};
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::path::Path::new("disk.img");
//! let file = std::fs::File::options().read(true).write(true).open(path)?;
//! // Held as QEMU's VM disk holds its image: `qemu-io -c 'write ...'` is refused meanwhile.
//! let lock = ImageLock::acquire(&file, path, Access::disk(true, false), LockMode::Auto)?;
//! assert!(lock.is_locked());
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod format;
pub mod lock;
pub mod status;
