//! Creating images, as QEMU's drivers do for `blockdev-create`: a `file` (QEMU's
//! `raw_co_create`) and a qcow2 image on a file (`qcow2_co_create`).
//!
//! This module owns the creation options, their checks in QEMU's order with QEMU's texts,
//! and the creation itself (synchronous: the caller runs it off its event loop, as a job);
//! never a node graph, a job or QMP. The qcow2 layout is imago's ([`create_qcow2`]).
//!
//! * A file is created (or opened) with mode 0644, locked as QEMU's creator locks it (write
//!   and resize held, everything but resize shared), cut to 0 and sized with the asked
//!   preallocation (`off`: a sparse `ftruncate`; `falloc`: `posix_fallocate`; `full`: zeros
//!   written); `metadata` is refused with QEMU's text.
//! * A qcow2 image is written over an existing file, which it holds with write and resize
//!   while it formats it.

mod file;
mod options;
#[cfg(feature = "qcow2")]
mod qcow2;

pub use file::create_file;
pub use options::{strerror, CreateError, FileCreate, Preallocation, Qcow2Create, Qcow2Version};
#[cfg(feature = "qcow2")]
pub use qcow2::create_qcow2;
