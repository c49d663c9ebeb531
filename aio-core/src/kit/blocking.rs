//! Running a request with blocking syscalls, for engines whose workers are threads, and how a
//! discard or write-zeroes maps onto the kernel.
//!
//! This module owns the one blocking implementation of every [`Op`]: `preadv2` / `pwritev2`
//! with the request's [`RwFlags`] and the remainder of short
//! transfers, `fsync` / `fdatasync`, `fallocate` for range ops and the `BLKDISCARD` ioctl for
//! a block device's discard ([`RangeOp`], shared with the kernel-queue engines). It keeps no
//! state and never decides which thread it runs on.

use std::io;
use std::os::fd::RawFd;

use super::transfer::{Step, Transfer};
use crate::engine::{FileKind, Op, Request, RwFlags};

thread_local! {
    /// The iovec array [`run_blocking`] builds a transfer's remainder in, kept per thread.
    static REMAINDER_IOVECS: std::cell::Cell<Vec<libc::iovec>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `BLKDISCARD`: `_IO(0x12, 119)`, a `[start, len]` pair of `u64` in bytes.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// How the kernel runs a discard or write-zeroes on a kind of file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOp {
    /// `fallocate(fd, mode, offset, len)`: every range op on a regular file, and write-zeroes
    /// on a block device (where `ZERO_RANGE` runs the kernel's zero-out, as `BLKZEROOUT`
    /// does, keeping the blocks mapped, and `PUNCH_HOLE` the zero-out that unmaps, failing with
    /// `EOPNOTSUPP` where the device cannot).
    Fallocate {
        /// `FALLOC_FL_*`.
        mode: libc::c_int,
    },
    /// The `BLKDISCARD` ioctl: a block device's discard (no `fallocate` mode means discard on
    /// a block device, and no io_uring or Linux AIO op runs an ioctl).
    BlockDiscard,
}

impl RangeOp {
    /// How `op` runs on a file of `kind` (None: not a range op).
    pub fn of(op: &Op, kind: FileKind) -> Option<RangeOp> {
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        Some(match op {
            Op::Discard { .. } if kind == FileKind::BlockDevice => RangeOp::BlockDiscard,
            Op::Discard { .. } => RangeOp::Fallocate { mode: punch },
            Op::WriteZeroes { unmap: true, .. } => RangeOp::Fallocate { mode: punch },
            Op::WriteZeroes { unmap: false, .. } => RangeOp::Fallocate {
                mode: libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            },
            _ => return None,
        })
    }
}

/// Retries `f` on `EINTR`, and on `EAGAIN` unless the caller wants it reported.
fn retry(report_eagain: bool, mut f: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
    loop {
        match f() {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && !report_eagain => continue,
            other => return other,
        }
    }
}

fn cvt_size(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn cvt_unit(ret: libc::c_int) -> io::Result<usize> {
    crate::sys::cvt(ret).map(|_| 0)
}

/// Runs `request` to its end with blocking syscalls and returns what its completion carries:
/// the bytes transferred (a read that reaches end of file returns what exists), 0 for a
/// sync, the length for a discard or write-zeroes, or the error. `EINTR` is retried, and
/// `EAGAIN` unless the request asked for [`RwFlags::NOWAIT`].
///
/// This is what a thread-pool worker runs (aio-pool), and what an engine whose kernel
/// interface lacks an op can run on a thread of its own.
pub fn run_blocking(request: &mut Request) -> io::Result<usize> {
    let fd = request.file.raw_fd();
    let flags = request.flags;
    let kind = request.file.kind();
    let op = &mut request.op;
    match op {
        Op::Fsync | Op::Fdatasync => {
            let datasync = matches!(op, Op::Fdatasync);
            retry(false, || {
                // SAFETY: fsync / fdatasync take only an fd, which `request.file` keeps open.
                let ret = unsafe {
                    if datasync {
                        libc::fdatasync(fd)
                    } else {
                        libc::fsync(fd)
                    }
                };
                cvt_unit(ret)
            })
        }
        Op::Discard { offset, len } | Op::WriteZeroes { offset, len, .. } => {
            let (offset, len) = (*offset, *len);
            let how = RangeOp::of(op, kind).expect("a range op");
            retry(false, || range(fd, how, offset, len))?;
            Ok(len as usize)
        }
        _ => {
            let is_read = op.is_read();
            let report_eagain = flags.contains(RwFlags::NOWAIT);
            let mut transfer = Transfer::default();
            // One iovec array per thread, reused: a worker runs request after request, and
            // this path must not cost an allocation each.
            REMAINDER_IOVECS.with(|cell| {
                let mut iovecs = cell.take();
                let result = loop {
                    let offset = transfer.offset(op) as libc::off_t;
                    transfer.remaining_iovecs(op, &mut iovecs);
                    let n = retry(report_eagain, || rw(fd, is_read, &iovecs, offset, flags));
                    match n.and_then(|n| transfer.advance(op, n)) {
                        Ok(Step::Done(total)) => break Ok(total),
                        Ok(Step::Again) => continue,
                        Err(e) => break Err(e),
                    }
                };
                // The pointers into this request's memory go with it.
                iovecs.clear();
                cell.set(iovecs);
                result
            })
        }
    }
}

/// One `preadv2` / `pwritev2` over `iovecs` at `offset`.
fn rw(
    fd: RawFd,
    is_read: bool,
    iovecs: &[libc::iovec],
    offset: libc::off_t,
    flags: RwFlags,
) -> io::Result<usize> {
    let count = iovecs.len().min(crate::engine::IOV_MAX) as libc::c_int;
    // SAFETY: `iovecs` describe the request's memory (its owned buffers, or caller memory
    // whose `LentMemory` contract keeps it valid and unshared while the request lives); the
    // request is borrowed mutably for the whole call, so nothing else touches that memory.
    // The fd is kept open by the request's `IoFile`.
    let ret = unsafe {
        if is_read {
            libc::preadv2(fd, iovecs.as_ptr(), count, offset, flags.to_rwf())
        } else {
            libc::pwritev2(fd, iovecs.as_ptr(), count, offset, flags.to_rwf())
        }
    };
    cvt_size(ret)
}

/// One discard or write-zeroes.
fn range(fd: RawFd, how: RangeOp, offset: u64, len: u64) -> io::Result<usize> {
    match how {
        RangeOp::Fallocate { mode } => {
            // SAFETY: fallocate takes an fd (kept open by the request) and plain integers.
            cvt_unit(unsafe { libc::fallocate(fd, mode, offset as i64, len as i64) })
        }
        RangeOp::BlockDiscard => {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 from the pointer, which points to `range`
            // for the duration of the call.
            cvt_unit(unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{AlignedBuf, IoFile};
    use std::os::unix::fs::MetadataExt;

    fn temp_file(len: usize) -> (IoFile, std::path::PathBuf) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("aio-blocking-{}-{n}", std::process::id()));
        std::fs::write(&path, vec![0x5au8; len]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (IoFile::from(f), path)
    }

    /// The request's flags are the ones `preadv2` / `pwritev2` get: on a thread whose kernel
    /// fails those calls with `EXDEV` when their flags argument is exactly the request's, a
    /// FUA write and a NOWAIT read fail, and a write without flags goes.
    #[test]
    fn flags_reach_the_kernel_call() {
        let (file, path) = temp_file(8192);
        let results = std::thread::spawn(move || {
            let dsync = RwFlags::FUA.to_rwf() as u32;
            let nowait = RwFlags::NOWAIT.to_rwf() as u32;
            let fail = aio_conformance::seccomp::fail_on_this_thread;
            fail(libc::SYS_pwritev2, &[(5, dsync)], libc::EXDEV).unwrap();
            fail(libc::SYS_preadv2, &[(5, nowait)], libc::EXDEV).unwrap();
            let mut fua =
                Request::write(&file, 0, AlignedBuf::new(4096), 1).with_flags(RwFlags::FUA);
            let mut plain = Request::write(&file, 0, AlignedBuf::new(4096), 2);
            let mut read =
                Request::read(&file, 0, AlignedBuf::new(4096), 3).with_flags(RwFlags::NOWAIT);
            [&mut fua, &mut plain, &mut read].map(|r| run_blocking(r).map_err(|e| e.raw_os_error()))
        })
        .join()
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            results,
            [Err(Some(libc::EXDEV)), Ok(4096), Err(Some(libc::EXDEV))]
        );
    }

    #[test]
    fn eagain_is_retried_unless_nowait_asked_for_it() {
        let again = || Err(io::Error::from_raw_os_error(libc::EAGAIN));
        let mut calls = 0;
        let reported = retry(true, || {
            calls += 1;
            again()
        });
        assert_eq!(reported.unwrap_err().raw_os_error(), Some(libc::EAGAIN));
        assert_eq!(calls, 1, "NOWAIT: reported at once");
        let mut calls = 0;
        let retried = retry(false, || {
            calls += 1;
            if calls < 3 {
                again()
            } else {
                Ok(5)
            }
        });
        assert_eq!((retried.unwrap(), calls), (5, 3), "otherwise waited out");
    }

    #[test]
    fn eintr_is_retried_even_for_nowait() {
        for report_eagain in [false, true] {
            let mut calls = 0;
            let r = retry(report_eagain, || {
                calls += 1;
                if calls < 3 {
                    Err(io::Error::from_raw_os_error(libc::EINTR))
                } else {
                    Ok(7)
                }
            });
            assert_eq!((r.unwrap(), calls), (7, 3), "nowait {report_eagain}");
        }
    }

    #[test]
    fn a_sync_is_an_fsync_of_the_fd() {
        // fsync(2) of a pipe fails with EINVAL: the sync really went to fsync, not down the
        // read/write path (which would fail with ESPIPE).
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        use std::os::fd::FromRawFd;
        // SAFETY: both fds were just created and are owned by nobody else.
        let (read_end, _write_end) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        let file = IoFile::from(read_end);
        for mut sync in [Request::fsync(&file, 1), Request::fdatasync(&file, 2)] {
            let e = run_blocking(&mut sync).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        }
    }

    /// The pool's rule for `NOWAIT`: a read the kernel answers with `EAGAIN` ends with
    /// `EAGAIN` at once, where every other read waits the `EAGAIN` out. The kernel's answer is
    /// made certain by a seccomp filter on the calling thread (a `preadv2` whose flags are
    /// exactly `RWF_NOWAIT` fails with `EAGAIN`), so the page cache and the disk's speed play
    /// no part: a read that retried would never end, and the test says so after a minute.
    #[test]
    fn a_nowait_read_the_kernel_refuses_reports_eagain_without_retrying() {
        let (file, path) = temp_file(8192);
        std::fs::remove_file(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let nowait = RwFlags::NOWAIT.to_rwf() as u32;
            let fail = aio_conformance::seccomp::fail_on_this_thread;
            fail(libc::SYS_preadv2, &[(5, nowait)], libc::EAGAIN).unwrap();
            let mut refused =
                Request::read(&file, 0, AlignedBuf::new(4096), 1).with_flags(RwFlags::NOWAIT);
            let refused = run_blocking(&mut refused).map_err(|e| e.raw_os_error());
            // The same read without the flag is not filtered: the rule is NOWAIT's alone.
            let mut plain = Request::read(&file, 0, AlignedBuf::new(4096), 2);
            let plain = run_blocking(&mut plain).map_err(|e| e.raw_os_error());
            let _ = tx.send((refused, plain));
        });
        let outcome = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a NOWAIT read refused with EAGAIN is still being retried after 60 s");
        assert_eq!(outcome, (Err(Some(libc::EAGAIN)), Ok(4096)));
    }

    /// End to end, on the page cache: a NOWAIT read of pages just dropped from the cache either
    /// reports `EAGAIN` or, when the disk finished the readahead the read started before it
    /// looked again (a fast disk does), returns the file's bytes. Never another error, never
    /// other bytes. Which of the two happens depends on the disk's speed, so both pass.
    #[test]
    fn a_nowait_read_of_dropped_pages_reports_eagain_or_the_right_bytes() {
        let (file, path) = temp_file(1 << 20);
        std::fs::remove_file(&path).unwrap();
        // SAFETY: fsync and posix_fadvise on an fd the IoFile keeps open; no pointers.
        unsafe {
            libc::fsync(file.raw_fd());
            libc::posix_fadvise(file.raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        let offset = 512 << 10;
        let mut r = Request::read(&file, offset as u64, AlignedBuf::new(4096), 1)
            .with_flags(RwFlags::NOWAIT);
        match run_blocking(&mut r) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            // A file system without RWF_NOWAIT says so.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                aio_conformance::skip(&format!("NOWAIT reads on {}: {e}", path.display()))
            }
            Err(e) => panic!("a NOWAIT read failed otherwise: {e}"),
            Ok(n) => {
                assert_eq!(n, 4096);
                let buf = r.op.into_buffers().into_one().unwrap();
                assert!(buf.iter().all(|&b| b == 0x5a), "the file's bytes");
            }
        }
    }

    #[test]
    fn reads_and_writes_whole_transfers_with_flags() {
        let (file, path) = temp_file(8192);
        let data: Vec<u8> = (0..3 * 1000).map(|i| (i % 251) as u8).collect();
        let bufs = data.chunks(1000).map(AlignedBuf::from_slice).collect();
        let mut w = Request::writev(&file, 100, bufs, 1).with_flags(RwFlags::FUA);
        assert_eq!(run_blocking(&mut w).unwrap(), 3000);
        let mut r = Request::read(&file, 100, AlignedBuf::new(3000), 2);
        assert_eq!(run_blocking(&mut r).unwrap(), 3000);
        assert_eq!(&r.op.into_buffers().into_one().unwrap()[..], &data[..]);
        // Past the end: what exists.
        let mut eof = Request::read(&file, 8000, AlignedBuf::new(1000), 3);
        assert_eq!(run_blocking(&mut eof).unwrap(), 192);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn discard_and_write_zeroes_keep_the_size_and_read_as_zeroes() {
        let (file, path) = temp_file(1 << 20);
        let before = std::fs::metadata(&path).unwrap();
        let mut d = Request::discard(&file, 0, 512 << 10, 1);
        assert_eq!(run_blocking(&mut d).unwrap(), 512 << 10);
        let mut z = Request::write_zeroes(&file, 512 << 10, 4096, false, 2);
        assert_eq!(run_blocking(&mut z).unwrap(), 4096);
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(after.len(), before.len(), "the size is kept");
        assert!(after.blocks() < before.blocks(), "the blocks are freed");
        let content = std::fs::read(&path).unwrap();
        assert!(content[..(512 << 10) + 4096].iter().all(|&b| b == 0));
        assert!(content[(512 << 10) + 4096..].iter().all(|&b| b == 0x5a));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn range_ops_map_by_file_kind() {
        let discard = Op::Discard { offset: 0, len: 1 };
        assert_eq!(
            RangeOp::of(&discard, FileKind::BlockDevice),
            Some(RangeOp::BlockDiscard)
        );
        assert!(matches!(
            RangeOp::of(&discard, FileKind::Regular),
            Some(RangeOp::Fallocate { .. })
        ));
        assert_eq!(RangeOp::of(&Op::Fsync, FileKind::Regular), None);
    }
}
