//! Block status: which parts of an image hold data and which are holes that read as zeros, as
//! QEMU's `bdrv_co_block_status` answers it for `qemu-img map` and NBD's `base:allocation`.
//!
//! This module owns the answer for a raw file (from `lseek(SEEK_DATA)` / `lseek(SEEK_HOLE)`, as
//! QEMU's `file-posix` driver finds it) and the extents' rules; it reads no data and changes
//! nothing. An image's answer is [`Image::block_status`](crate::Image::block_status): a qcow2
//! image's from its mapping, the null image's all zeros.
//!
//! * The extents cover the range asked for, in order, without gaps, each of one kind; two
//!   neighbours are never of the same kind.
//! * A range past the end of the file is a hole (reads as zeros).
//! * Where the file system cannot say (no `SEEK_DATA`, a block device), everything is data:
//!   data is always a safe answer, a hole only where the file system says so.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// What a range of an image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    /// Allocated: reads return what was written (zeros included).
    Data,
    /// Not allocated: reads return zeros, and nothing is stored (NBD's `HOLE | ZERO`).
    Hole,
}

/// A range of an image and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Where it starts, in bytes.
    pub offset: u64,
    /// How long it is, in bytes (never 0).
    pub len: u64,
    /// Data or hole.
    pub kind: ExtentKind,
}

/// A range of an image and the depth of the layer that holds it, as QEMU's
/// `qemu:allocation-depth` answers: 1 for the image itself (every byte of a raw file or the
/// null device; a qcow2 cluster mapped or zeroed in the image), 2 for its first backing file,
/// and so on; 0 where no layer holds it (it reads as zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// Where it starts, in bytes.
    pub offset: u64,
    /// How long it is, in bytes (never 0).
    pub len: u64,
    /// The depth of the layer holding it (0: none).
    pub depth: u32,
}

/// Adds `[offset, offset + len)` at `depth` to `out`, merged with the last range if it is at
/// the same depth.
pub(crate) fn push_depth(out: &mut Vec<Allocation>, offset: u64, len: u64, depth: u32) {
    if len == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.depth == depth && last.offset + last.len == offset => last.len += len,
        _ => out.push(Allocation { offset, len, depth }),
    }
}

/// One `lseek` with `whence` from `offset`: the offset found, or None for `ENXIO` (no more
/// data after `offset`, for `SEEK_DATA`; `offset` past the end).
fn seek(file: &impl AsFd, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let at = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
    // SAFETY: `file` is an open descriptor for the call; lseek takes no pointer. It moves
    // the descriptor's offset, which no request of this crate uses (they give offsets).
    let found = unsafe { libc::lseek(file.as_fd().as_raw_fd(), at, whence) };
    if found >= 0 {
        return Ok(Some(found as u64));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// Whether an `lseek` error says the file system cannot tell data from holes.
fn cannot_tell(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOTTY | libc::ESPIPE)
    )
}

/// Adds `[offset, offset + len)` of `kind` to `out`, merged with the last extent if it is of
/// the same kind.
pub(crate) fn push(out: &mut Vec<Extent>, offset: u64, len: u64, kind: ExtentKind) {
    if len == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.kind == kind && last.offset + last.len == offset => last.len += len,
        _ => out.push(Extent { offset, len, kind }),
    }
}

/// The extents of `[offset, offset + len)` of the raw file `file` (whose size is `size`: a
/// block device's is not its metadata's).
pub fn raw_extents(file: &impl AsFd, size: u64, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
    let end = offset.saturating_add(len);
    let mut out = Vec::new();
    let mut at = offset;
    let in_file = end.min(size);
    while at < in_file {
        let data = match seek(file, at, libc::SEEK_DATA) {
            Ok(found) => found,
            Err(e) if cannot_tell(&e) => {
                push(&mut out, at, in_file - at, ExtentKind::Data);
                at = in_file;
                break;
            }
            Err(e) => return Err(e),
        };
        // No data from `at` on (ENXIO), or the next data beyond the range: a hole to there.
        let data = data.unwrap_or(in_file).min(in_file);
        push(&mut out, at, data - at, ExtentKind::Hole);
        if data >= in_file {
            at = in_file;
            break;
        }
        // Data from `data` to the next hole (the end of the file is one).
        let hole = seek(file, data, libc::SEEK_HOLE)?
            .unwrap_or(in_file)
            .clamp(data + 1, in_file);
        push(&mut out, data, hole - data, ExtentKind::Data);
        at = hole;
    }
    push(&mut out, at, end - at, ExtentKind::Hole);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    fn extent(offset: u64, len: u64, kind: ExtentKind) -> Extent {
        Extent { offset, len, kind }
    }

    /// A sparse file of 4 MiB with data at [1 MiB, 1.5 MiB) and [3 MiB, 4 MiB), where the
    /// file system keeps holes (tmpfs and ext4 both do).
    fn sparse() -> (tempfile::TempDir, File) {
        // tmpfs keeps holes wherever Linux runs; elsewhere /tmp.
        let tmp = aio_test_support::images::memory_dir("block-status");
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(tmp.path().join("sparse"))
            .unwrap();
        f.set_len(4 << 20).unwrap();
        f.write_all_at(&vec![1u8; 512 << 10], 1 << 20).unwrap();
        f.write_all_at(&vec![2u8; 1 << 20], 3 << 20).unwrap();
        (tmp, f)
    }

    #[test]
    fn a_sparse_file_reads_as_holes_and_data_in_order_without_gaps() {
        let (_tmp, f) = sparse();
        let size = 4 << 20;
        let all = raw_extents(&f, size, 0, size).unwrap();
        if all == [extent(0, size, ExtentKind::Data)] {
            // A file system without holes: everything is data, which is still true.
            println!("skipped: this file system keeps no holes");
            return;
        }
        use ExtentKind::{Data, Hole};
        assert_eq!(
            all,
            [
                extent(0, 1 << 20, Hole),
                extent(1 << 20, 512 << 10, Data),
                extent(
                    (1 << 20) + (512 << 10),
                    (3 << 20) - (1 << 20) - (512 << 10),
                    Hole
                ),
                extent(3 << 20, 1 << 20, Data),
            ]
        );
        // A range inside one extent, one across two, one past the end.
        assert_eq!(
            raw_extents(&f, size, 4096, 8192).unwrap(),
            [extent(4096, 8192, Hole)]
        );
        assert_eq!(
            raw_extents(&f, size, (3 << 20) - 4096, 8192).unwrap(),
            [
                extent((3 << 20) - 4096, 4096, Hole),
                extent(3 << 20, 4096, Data)
            ]
        );
        assert_eq!(
            raw_extents(&f, size, size - 4096, 8192).unwrap(),
            [extent(size - 4096, 4096, Data), extent(size, 4096, Hole)]
        );
        assert_eq!(raw_extents(&f, size, 0, 0).unwrap(), []);
    }
}
