//! The storage's I/O outside a request: blocking syscalls on the calling thread, for opening an
//! image and for its final flush (no queue, no engine). Never on a queue's path.

use std::io;

use crate::blocking::retry;
pub(super) use crate::blocking::{discard, fdatasync, set_len, write_zeroes};

use aio_core::engine::IoFile;

use imago::io_buffers::{IoVector, IoVectorMut};

/// Fills `bufv` from `offset`, zeros past the end of the file.
pub(super) fn readv(file: &IoFile, mut bufv: IoVectorMut<'_>, mut offset: u64) -> io::Result<()> {
    while !bufv.is_empty() {
        let n = {
            // SAFETY: the iovecs are used only in this call, while `bufv` is borrowed.
            let iov = unsafe { bufv.as_iovec() };
            let count = iov.len().min(aio_core::engine::IOV_MAX) as libc::c_int;
            // SAFETY: `iov` describes live, writable memory of `bufv` (imago's contract for
            // `pure_readv`); `count` is within the slice.
            retry(|| unsafe {
                libc::preadv(file.raw_fd(), iov.as_ptr(), count, offset as libc::off_t)
            })?
        };
        if n == 0 {
            bufv.fill(0);
            break;
        }
        bufv = bufv.split_tail_at(n as u64);
        offset += n as u64;
    }
    Ok(())
}

/// Writes all of `bufv` at `offset`.
pub(super) fn writev(file: &IoFile, mut bufv: IoVector<'_>, mut offset: u64) -> io::Result<()> {
    while !bufv.is_empty() {
        let n = {
            // SAFETY: as in `readv`.
            let iov = unsafe { bufv.as_iovec() };
            let count = iov.len().min(aio_core::engine::IOV_MAX) as libc::c_int;
            // SAFETY: `iov` describes live memory of `bufv`; the kernel only reads it.
            retry(|| unsafe {
                libc::pwritev(file.raw_fd(), iov.as_ptr(), count, offset as libc::off_t)
            })?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bufv = bufv.split_tail_at(n as u64);
        offset += n as u64;
    }
    Ok(())
}
