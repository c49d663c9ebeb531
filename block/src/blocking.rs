//! Blocking syscalls on the calling thread, for I/O outside a request: opening and closing
//! an image, and the copies a block job makes from a thread of its own (never on a queue's
//! path, where the engine runs every request).

use std::io;

use aio_core::engine::{AlignedBuf, IoFile};

/// Retries `f` on `EINTR`; a negative return is the OS error.
pub(crate) fn retry(mut f: impl FnMut() -> isize) -> io::Result<usize> {
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

/// Fills `buf` from `offset` of `file`, zeros past its end.
pub(crate) fn read_at(file: &IoFile, buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is live, writable memory of `rest.len()` bytes for the call.
        let n = retry(|| unsafe {
            libc::pread(
                file.raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                offset as libc::off_t,
            )
        })?;
        if n == 0 {
            rest.fill(0);
            break;
        }
        done += n;
        offset += n as u64;
    }
    Ok(())
}

/// Writes all of `buf` at `offset` of `file`.
pub(crate) fn write_at(file: &IoFile, buf: &[u8], mut offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &buf[done..];
        // SAFETY: `rest` is live memory of `rest.len()` bytes for the call; the kernel only
        // reads it.
        let n = retry(|| unsafe {
            libc::pwrite(
                file.raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                offset as libc::off_t,
            )
        })?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n;
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
pub(crate) fn write_zeroes(file: &IoFile, offset: u64, len: u64, align: usize) -> io::Result<()> {
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
#[cfg_attr(not(feature = "qcow2"), allow(dead_code))] // qcow2 storage's.
pub(crate) fn discard(file: &IoFile, offset: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(file, mode, offset, len)
}

/// `fdatasync(2)`.
pub(crate) fn fdatasync(file: &IoFile) -> io::Result<()> {
    // SAFETY: fdatasync on an open fd.
    retry(|| unsafe { libc::fdatasync(file.raw_fd()) as isize }).map(drop)
}

/// `ftruncate(2)`.
#[cfg_attr(not(feature = "qcow2"), allow(dead_code))] // qcow2 storage's.
pub(crate) fn set_len(file: &IoFile, len: u64) -> io::Result<()> {
    // SAFETY: ftruncate on an open fd.
    retry(|| unsafe { libc::ftruncate(file.raw_fd(), len as libc::off_t) as isize }).map(drop)
}
