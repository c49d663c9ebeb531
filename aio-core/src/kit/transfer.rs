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
    /// Accounts for `n` more bytes of `op` (a range op completes with its whole length).
    pub fn advance(&mut self, op: &Op, n: usize) -> io::Result<Step> {
        if op.is_range() {
            return Ok(Step::Done(op.range_len() as usize));
        }
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
        for (base, len) in op.segments() {
            if skip >= len {
                skip -= len;
                continue;
            }
            out.push(libc::iovec {
                // `skip < len`: the address stays inside the segment (wrapping_add never
                // leaves it, and computing it needs no unsafe).
                iov_base: base.wrapping_add(skip).cast(),
                iov_len: len - skip,
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
        // A finished write advanced by nothing is still done, not out of space.
        assert_eq!(t.advance(&op, 0).unwrap(), Step::Done(8));
    }
}
