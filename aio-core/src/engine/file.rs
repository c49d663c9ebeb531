//! `IoFile`: the file requests refer to, and what is learnt about it once when it is opened.
//!
//! This module owns the shared fd and the facts engines and validation read without a syscall
//! per request: `O_DIRECT`, the kind of file (regular file or block device) and the alignment
//! direct I/O needs. It performs no I/O on the file's data.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

/// What a file is, as far as the engines care (read once, with `fstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file: discard and write-zeroes are `fallocate(2)` calls.
    Regular,
    /// A block device: discard is `BLKDISCARD`, write-zeroes `BLKZEROOUT`.
    BlockDevice,
    /// Anything else (a pipe, a character device, a directory).
    Other,
}

/// The alignment direct I/O (`O_DIRECT`) needs on a file: every buffer address a multiple of
/// `memory`, every file offset and every segment length a multiple of `offset`.
///
/// Read with `statx(STATX_DIOALIGN)` where the file system reports it (ext4, xfs, btrfs, block
/// devices); elsewhere (tmpfs) 512 bytes for both, the historical minimum of every Linux file
/// system, so that a request passing the check is not refused for alignment by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectIoAlignment {
    /// Alignment of buffer addresses.
    pub memory: usize,
    /// Alignment of file offsets and of segment lengths.
    pub offset: usize,
}

/// The alignment assumed where the file system does not report one.
const FALLBACK_ALIGN: usize = 512;

/// A file that requests refer to. Cloning is cheap; every request holds a clone, so the fd
/// stays open while any request on it is in flight, whatever the caller does with its own
/// handle.
///
/// `IoFile` is `Send` and `Sync`: it is an `Arc` of an owned fd and facts that never change.
#[derive(Clone)]
pub struct IoFile {
    fd: Arc<OwnedFd>,
    /// O_DIRECT as the fd was when this `IoFile` was made (read once, not per request).
    direct: Option<DirectIoAlignment>,
    kind: FileKind,
}

impl fmt::Debug for IoFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IoFile(fd {}, {:?})", self.fd.as_raw_fd(), self.kind)
    }
}

impl IoFile {
    /// Takes ownership of an open fd (e.g. from `File::into()`).
    pub fn new(fd: impl Into<OwnedFd>) -> Self {
        let fd: OwnedFd = fd.into();
        let raw = fd.as_raw_fd();
        // Miri (scripts/miri.sh) runs neither fcntl nor statx: there the file is a plain one.
        let flags = if cfg!(miri) {
            0
        } else {
            // SAFETY: F_GETFL reads the status flags of an fd we own; it takes no pointer.
            unsafe { libc::fcntl(raw, libc::F_GETFL) }
        };
        let direct = flags >= 0 && flags & libc::O_DIRECT != 0;
        let (kind, align) = describe(fd.as_fd());
        IoFile {
            fd: Arc::new(fd),
            direct: direct.then_some(align),
            kind,
        }
    }

    /// Duplicates (close-on-exec) an fd that the caller keeps owning: requests then hold the
    /// duplicate, whatever the caller does with its own. Fails only when the process is out of
    /// descriptors (`EMFILE`).
    pub fn dup(fd: impl AsFd) -> io::Result<Self> {
        Ok(IoFile::new(fd.as_fd().try_clone_to_owned()?))
    }

    /// The raw fd (valid while this `IoFile` or a clone lives).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether the fd was opened with `O_DIRECT`, as read once when this `IoFile` was made
    /// (a later `fcntl(F_SETFL)` on the fd is not seen). Engines use it to tell buffered I/O
    /// apart without a syscall per request.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The alignment direct I/O needs on this file (None: not opened with `O_DIRECT`, so any
    /// alignment works). [`Request::validate`](super::Request::validate) checks requests
    /// against it.
    pub fn direct_io_alignment(&self) -> Option<DirectIoAlignment> {
        self.direct
    }

    /// What the file is (regular file, block device, other), read once.
    pub fn kind(&self) -> FileKind {
        self.kind
    }
}

/// The kind of file and the direct-I/O alignment it reports.
fn describe(fd: BorrowedFd<'_>) -> (FileKind, DirectIoAlignment) {
    let fallback = DirectIoAlignment {
        memory: FALLBACK_ALIGN,
        offset: FALLBACK_ALIGN,
    };
    if cfg!(miri) {
        return (FileKind::Other, fallback);
    }
    let Some(stx) = statx_of(fd) else {
        return (FileKind::Other, fallback);
    };
    let kind = match stx.stx_mode as libc::mode_t & libc::S_IFMT {
        libc::S_IFREG => FileKind::Regular,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Other,
    };
    let reported = stx.stx_mask & libc::STATX_DIOALIGN != 0
        && stx.stx_dio_mem_align > 0
        && stx.stx_dio_offset_align > 0;
    let align = if reported {
        DirectIoAlignment {
            memory: stx.stx_dio_mem_align as usize,
            offset: stx.stx_dio_offset_align as usize,
        }
    } else {
        fallback
    };
    (kind, align)
}

/// `statx` of `fd` itself, asking for its type and direct-I/O alignment; `None` if it fails.
/// Fields the kernel does not report stay 0.
fn statx_of(fd: BorrowedFd<'_>) -> Option<libc::statx> {
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is an empty C string with AT_EMPTY_PATH, so statx describes `fd`
    // itself; `stx` is a valid, writable statx that outlives the call.
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_TYPE | libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    (ret == 0).then_some(stx)
}

impl AsFd for IoFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<std::fs::File> for IoFile {
    fn from(f: std::fs::File) -> Self {
        IoFile::new(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn is_direct_follows_the_open_flags() {
        let path = std::env::temp_dir().join(format!("aio-core-direct-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let buffered = IoFile::from(std::fs::File::open(&path).unwrap());
        assert!(!buffered.is_direct());
        assert_eq!(buffered.direct_io_alignment(), None);
        assert_eq!(buffered.kind(), FileKind::Regular);
        // The engine tests need O_DIRECT in the temp dir too (README, Tests).
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("O_DIRECT in the system temp dir");
        let direct = IoFile::from(direct);
        assert!(direct.is_direct());
        let align = direct.direct_io_alignment().expect("direct");
        assert!(align.memory.is_power_of_two() && align.offset.is_power_of_two());
        assert!(direct.clone().is_direct(), "clones share it");
        std::fs::remove_file(&path).unwrap();
        let null = IoFile::from(std::fs::File::open("/dev/null").unwrap());
        assert_eq!(null.kind(), FileKind::Other);
    }

    /// What `statx` says of `fd`: its type bits and, where reported, the direct-I/O alignment.
    fn reported(fd: BorrowedFd<'_>) -> (libc::mode_t, Option<(usize, usize)>) {
        let stx = statx_of(fd).expect("statx");
        let align = (stx.stx_mask & libc::STATX_DIOALIGN != 0).then_some((
            stx.stx_dio_mem_align as usize,
            stx.stx_dio_offset_align as usize,
        ));
        (stx.stx_mode as libc::mode_t & libc::S_IFMT, align)
    }

    /// The kind and alignment are the kernel's: a regular file in the temp dir (whose file
    /// system reports `STATX_DIOALIGN` on this project's kernels) and a loop device.
    #[test]
    fn the_kind_and_the_alignment_are_what_the_kernel_reports() {
        let tmp = aio_conformance::engine::TempFile::with_len(4096, 0);
        let file = crate::engine::types_tests::open(tmp.path(), libc::O_DIRECT)
            .expect("O_DIRECT in the system temp dir");
        let (mode, kernel) = reported(file.as_fd());
        assert_eq!(mode, libc::S_IFREG);
        match kernel {
            Some((memory, offset)) if memory > 0 && offset > 0 => {
                assert_eq!(
                    file.direct_io_alignment(),
                    Some(DirectIoAlignment { memory, offset })
                );
            }
            other => aio_conformance::skip(&format!(
                "the temp dir's file system reports no direct-I/O alignment ({other:?})"
            )),
        }
        let Some(dev) = aio_conformance::available(
            "a loop device",
            aio_conformance::engine::TempFile::on_a_loop_device(4096, 0),
        ) else {
            return;
        };
        let device = crate::engine::types_tests::open(dev.path(), libc::O_DIRECT).unwrap();
        assert_eq!(device.kind(), FileKind::BlockDevice);
        assert!(
            format!("{device:?}").starts_with("IoFile(fd "),
            "{device:?}"
        );
        // Where the kernel's alignment is the fallback's (512 on this project's machines),
        // only a device with larger sectors tells them apart.
        let Some(big) = aio_conformance::available(
            "a loop device with 4 KiB sectors",
            aio_conformance::engine::TempFile::on_a_loop_device_with_sectors(4096, 0, 4096),
        ) else {
            return;
        };
        let big_sectors = crate::engine::types_tests::open(big.path(), libc::O_DIRECT).unwrap();
        let (_, kernel) = reported(big_sectors.as_fd());
        let (memory, offset) = kernel.expect("a block device reports its alignment");
        assert_eq!(offset, 4096, "the sector size");
        assert_eq!(
            big_sectors.direct_io_alignment(),
            Some(DirectIoAlignment { memory, offset })
        );
    }
}
