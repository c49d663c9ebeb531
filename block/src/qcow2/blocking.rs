//! The storage's I/O outside a request: blocking syscalls on the calling thread, for opening an
//! image and for its final flush (no queue, no engine). Never on a queue's path.

use std::io;

use aio_core::engine::{AlignedBuf, IoFile};
use imago::io_buffers::{IoVector, IoVectorMut};

/// Retries `f` on `EINTR`; a negative return is the OS error.
fn retry(mut f: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = f();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

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

fn fallocate(file: &IoFile, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on an open fd; no pointers.
    retry(|| unsafe {
        libc::fallocate(
            file.raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        ) as isize
    })
    .map(drop)
}

/// Makes `[offset, offset + len)` read as zeros: `FALLOC_FL_ZERO_RANGE`, or zeros written
/// (`align`-sized pieces for `O_DIRECT`) where the file system has no such call.
pub(super) fn write_zeroes(file: &IoFile, offset: u64, len: u64, align: usize) -> io::Result<()> {
    match fallocate(file, libc::FALLOC_FL_ZERO_RANGE, offset, len) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
        other => return other,
    }
    const CHUNK: u64 = 1 << 20;
    let zeros = AlignedBuf::new(CHUNK.min(len).max(align as u64) as usize);
    let (mut at, end) = (offset, offset + len);
    while at < end {
        let n = (end - at).min(zeros.len() as u64) as usize;
        // SAFETY: `zeros` is live for the call and at least `n` bytes long.
        let written = retry(|| unsafe {
            libc::pwrite(file.raw_fd(), zeros.as_ptr().cast(), n, at as libc::off_t)
        })?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        at += written as u64;
    }
    Ok(())
}

/// Punches a hole (the file keeps its size).
pub(super) fn discard(file: &IoFile, offset: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(file, mode, offset, len)
}

/// `fdatasync(2)`.
pub(super) fn fdatasync(file: &IoFile) -> io::Result<()> {
    // SAFETY: fdatasync on an open fd.
    retry(|| unsafe { libc::fdatasync(file.raw_fd()) as isize }).map(drop)
}

/// `ftruncate(2)`.
pub(super) fn set_len(file: &IoFile, len: u64) -> io::Result<()> {
    // SAFETY: ftruncate on an open fd.
    retry(|| unsafe { libc::ftruncate(file.raw_fd(), len as libc::off_t) as isize }).map(drop)
}
