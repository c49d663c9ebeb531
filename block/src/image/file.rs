//! An image's file opened for serving: `O_DIRECT`, its size, its first bytes probed.
//!
//! This module owns the open flags every image file gets (the image's own, a qcow2 image's
//! backing files); it never locks (that is [`crate::lock`]'s) nor parses a format.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use aio_core::engine::AlignedBuf;

use crate::format::{self, KnownFormat};

/// Opens `path` (a file or a block device) with `O_DIRECT`, for writing when `writable`, and
/// reads its size (seeking to the end works for a block device as for a file).
pub(crate) fn open_direct(path: &Path, writable: bool) -> io::Result<(std::fs::File, u64)> {
    use std::io::Seek;
    let file = OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)?;
    let bytes = (&file).seek(io::SeekFrom::End(0))?;
    Ok((file, bytes))
}

/// The known format the first bytes of `file` (opened `O_DIRECT`) belong to, if any.
pub(crate) fn probe_header(file: &std::fs::File) -> io::Result<Option<KnownFormat>> {
    use std::os::unix::fs::FileExt;
    // One aligned 4 KiB read: a whole logical block for every device (`O_DIRECT`), of which
    // the probe looks at the first bytes; an image smaller than that reads short.
    let mut buf = AlignedBuf::new(4096);
    let n = file.read_at(&mut buf[..], 0)?;
    Ok(format::probe(&buf[..n.min(format::PROBE_BYTES)]))
}
