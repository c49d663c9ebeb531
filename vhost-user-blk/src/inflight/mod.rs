//! vhost-user's in-flight I/O tracking for split virtqueues
//! (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`): the shared region that lets a backend restarted
//! under a running guest know which requests its predecessor had taken and not completed.
//!
//! This module owns the region: its layout (`layout.rs`), its creation
//! (`VHOST_USER_GET_INFLIGHT_FD`), its mapping and validation (`VHOST_USER_SET_INFLIGHT_FD`),
//! the log a queue writes into it ([`RegionLog`], the device crate's
//! [`InflightLog`](aio_virtio_blk::inflight::InflightLog); both in `region.rs`), its errors
//! (`error.rs`) and the recovery when a queue starts (`recovery.rs`); this file only gathers
//! them. It never touches a ring: the device's queue runs the heads it is given.
//!
//! * **The layout is libvhost-user's**, so a region left by another backend reads the same.
//!   Queue `q` starts at `q * queue_stride(queue_size)`, the stride being
//!   `16 * queue_size + 2` rounded up to 64 bytes:
//!
//!   | offset | field |
//!   | --- | --- |
//!   | 0 | `features: u64` (unused, 0) |
//!   | 8 | `version: u16` (0: never started; 1: this layout in use) |
//!   | 10 | `desc_num: u16` (entries below) |
//!   | 12 | `last_batch_head: u16` (the head whose used element is being published) |
//!   | 14 | `used_idx: u16` (the used index once that head is out of flight) |
//!   | 16 + 16 i | `desc[i]`: `inflight: u8`, 5 bytes padding, `next: u16`, `counter: u64` |
//!
//! * **The region is created once** by the first backend, zeroed and sealed against resizing
//!   (`F_SEAL_SHRINK | F_SEAL_GROW`); the frontend keeps its memfd across reconnects and hands
//!   it to every later backend, which only maps it.
//! * **The region is input.** Its geometry is checked against the message and the file's size
//!   before it is mapped, each queue's header against the ring before the queue starts, and
//!   every access goes through a view whose bounds were checked once: a region too small,
//!   out-of-range heads, duplicate counters or a torn last batch give a refused queue or an
//!   ignored entry, never a panic or an access outside the mapping. Like guest memory, the
//!   memfd is trusted not to shrink under the mapping (it is sealed when this module made it).
//! * **Every access is atomic**: the region is memory shared with other processes (QEMU maps
//!   it too), so it is only read and written through `AtomicU8/16/64`, with release stores in
//!   the order the specification gives.

mod error;
mod layout;
mod recovery;
mod region;

pub use error::InflightError;
pub use layout::{queue_stride, region_size, MAX_QUEUES, VERSION};
pub use recovery::{Recovered, RingState};
pub use region::{InflightRegion, QueueRegion, RegionLog};

#[cfg(test)]
mod tests;
