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
//! * [`status`] and [`Image::block_status`]: block status, which ranges of an image hold data
//!   and which are holes that read as zeros (a raw file's from `SEEK_DATA` / `SEEK_HOLE`, a
//!   qcow2 image's from its mapping), as `qemu-img map` and NBD's
//!   `base:allocation` report it.
//! * [`create`]: images created as QEMU's `file` and `qcow2` drivers create them
//!   (`blockdev-create`), with QEMU's checks and texts.
//! * [`lock`]: image locks QEMU's tools honour: OFD locks on the bytes QEMU's `file-posix`
//!   driver uses (100 + each permission held, 200 + each permission not shared), taken and
//!   checked when an image is opened, released when its holder goes; `locking=auto|on|off`.
//!
//! * [`image::Image`]: an image open for serving (a raw file or block device, or a window of
//!   one; a qcow2 image and its backing chain, through `imago`, feature `qcow2`; the null
//!   device): opening with the format rule and the locks, its size shared by every export,
//!   resize, inactive images and their transitions (QEMU's: reads only, no lock; for a
//!   migration's or an upgrade's handover), closing.
//! * [`ImageQueue`]: an image's requests from one context ([`BlockRequest`]: read, write
//!   with FUA, flush, discard, write-zeroes), on the engine attached there: straight into and
//!   out of the memory the caller lends ([`LentMemory`]), each request's end told to the caller's
//!   [`Reply`]. A qcow2 image's reads and writes inside clusters it owns go to the engine as
//!   a raw image's do (a mapping cache); the rest run as tasks through imago.
//! * [`block_copy`] and [`backup`]: a point-in-time copy of an image onto another while it is
//!   written (copy-before-write in the request filter; QEMU's backup job in every sync mode,
//!   its bitmap modes, the fleecing rule for a scratch image over its backing node).
//! * [`stats`]: QEMU's accounting per image (`query-blockstats`) and latency histograms.
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

pub mod backup;
pub mod bitmap;
pub mod block_copy;
mod blocking;
pub mod create;
mod filter;
pub mod format;
pub mod image;
pub mod lock;
#[cfg(feature = "qcow2")]
mod qcow2;
mod queue;
pub mod request;
pub mod stats;
pub mod status;

pub use image::{Image, ImageOptions};
pub use queue::ImageQueue;
#[allow(deprecated)]
pub use request::Buffers;
pub use request::{BlockRequest, LentMemory, Reply};
