//! Short transfers: the arithmetic behind resubmitting the remainder of a read or write.
//!
//! This module owns [`Transfer`] and [`Step`]. It performs no I/O: engines feed it each result
//! the kernel or a worker returns.

use std::io;

use crate::engine::Op;

/// What one step of a transfer amounted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Finished: this many bytes in all.
    Done(usize),
    /// Short: resubmit the remainder.
    Again,
}

/// Progress of a read or write that the kernel may complete in several pieces.
///
/// Engines call [`Transfer::advance`] with each result; a short read or write leaves
/// [`Step::Again`] and [`Transfer::remaining_iovecs`] describes what is left. A read that
/// returns 0 has reached end of file and finishes with what it has; a write that returns 0
/// cannot make progress and fails with `ENOSPC` (as QEMU reports it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes done so far.
    pub done: usize,
}

impl Transfer {
    /// Accounts for `n` more bytes of `op`.
    pub fn advance(&mut self, op: &Op, n: usize) -> io::Result<Step> {
        let total = op.len();
        if n == 0 && total > self.done {
            return if op.is_read() {
                Ok(Step::Done(self.done))
            } else {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            };
        }
        self.done = (self.done + n).min(total);
        if self.done >= total {
            Ok(Step::Done(self.done))
        } else {
            Ok(Step::Again)
        }
    }

    /// The file offset of the remainder.
    pub fn offset(&self, op: &Op) -> u64 {
        op.offset() + self.done as u64
    }

    /// Fills `out` with iovecs covering the part of `op`'s buffers not yet transferred.
    ///
    /// The iovecs point into `op`'s buffers: they are valid while `op` is neither moved out
    /// of nor dropped, which the engine guarantees by keeping the op in its in-flight table
    /// until the kernel is done with it.
    pub fn remaining_iovecs(&self, op: &mut Op, out: &mut Vec<libc::iovec>) {
        out.clear();
        let mut skip = self.done;
        for buf in op.buffers_mut() {
            if skip >= buf.len() {
                skip -= buf.len();
                continue;
            }
            // SAFETY: `skip < buf.len()`, so the pointer stays inside the allocation.
            let base = unsafe { buf.as_mut_ptr().add(skip) };
            out.push(libc::iovec {
                iov_base: base.cast(),
                iov_len: buf.len() - skip,
            });
            skip = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::AlignedBuf;

    #[test]
    fn transfer_remainders() {
        let mut op = Op::Readv {
            offset: 100,
            bufs: vec![AlignedBuf::new(10), AlignedBuf::new(20)],
        };
        let mut t = Transfer::default();
        let mut iov = Vec::new();
        t.remaining_iovecs(&mut op, &mut iov);
        assert_eq!(iov.iter().map(|v| v.iov_len).collect::<Vec<_>>(), [10, 20]);
        assert_eq!(t.advance(&op, 15).unwrap(), Step::Again);
        assert_eq!(t.offset(&op), 115);
        t.remaining_iovecs(&mut op, &mut iov);
        assert_eq!(iov.iter().map(|v| v.iov_len).collect::<Vec<_>>(), [15]);
        assert_eq!(
            t.advance(&op, 0).unwrap(),
            Step::Done(15),
            "EOF: what exists"
        );
        let op = Op::Write {
            offset: 0,
            buf: AlignedBuf::new(8),
        };
        let mut t = Transfer::default();
        assert_eq!(t.advance(&op, 3).unwrap(), Step::Again);
        assert_eq!(
            t.advance(&op, 0).unwrap_err().raw_os_error(),
            Some(libc::ENOSPC)
        );
        assert_eq!(t.advance(&op, 5).unwrap(), Step::Done(8));
    }
}
