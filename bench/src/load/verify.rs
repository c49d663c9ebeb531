//! Block stamps for `--verify`: every block written carries its offset, a generation and a
//! crc32c, so a read can tell a correct block from a misplaced, torn, stale or corrupt one.
//!
//! This module owns the stamp layout, its check, and the [`Ledger`] that knows which generation
//! each block must hold. Which block a request takes and what it counts is the load
//! generator's ([`super::generator`]).
//!
//! Layout of a stamped block (little-endian):
//!
//! | bytes   | field                                              |
//! | ------- | -------------------------------------------------- |
//! | 0..8    | magic `aio-rsV1`                                   |
//! | 8..16   | the block's byte offset in the disk                |
//! | 16..24  | generation (0 = as the image was created)          |
//! | 24..28  | crc32c of bytes 8..24 and 32..end                  |
//! | 28..32  | zero                                               |
//! | 32..end | payload derived from offset and generation        |

use super::pattern::Direction;

/// The stamp's magic.
const MAGIC: &[u8; 8] = b"aio-rsV1";

/// Bytes of the header before the payload.
pub const HEADER: usize = 32;

/// A block that does not hold what its stamp promises.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// No stamp at all (never written by us, or overwritten by something else).
    #[error("offset {offset}: no stamp (magic missing)")]
    NotStamped {
        /// The block's offset.
        offset: u64,
    },
    /// A stamp for another offset: the data landed in the wrong place.
    #[error("offset {offset}: holds the block stamped for offset {found}")]
    WrongOffset {
        /// The block's offset.
        offset: u64,
        /// The offset in the stamp.
        found: u64,
    },
    /// The checksum does not match: a torn or corrupted block.
    #[error("offset {offset}: crc32c mismatch (generation {generation} in the stamp)")]
    Corrupt {
        /// The block's offset.
        offset: u64,
        /// The generation in the stamp.
        generation: u64,
    },
    /// A valid stamp of another generation than the last write acknowledged.
    #[error("offset {offset}: generation {found}, expected {expected} (stale or lost write)")]
    Stale {
        /// The block's offset.
        offset: u64,
        /// The generation of the last acknowledged write.
        expected: u64,
        /// The generation read.
        found: u64,
    },
}

/// What the writer of a stamped disk knows about each block: which generation it last wrote
/// and had acknowledged, and which blocks have a request in flight. It lives with the disk
/// image, so it outlasts the runs (cells) that use the disk.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The block size the disk was stamped with.
    pub bs: usize,
    /// Per block: the generation of the last acknowledged write (`None`: a write failed, so
    /// the contents are unknown and any valid stamp is accepted).
    pub acked: Vec<Option<u64>>,
    /// Per block: a request is in flight (the writer keeps one per block at a time, so that
    /// each read has exactly one right answer).
    pub busy: Vec<bool>,
    /// The generation the next write gets.
    pub next_generation: u64,
}

impl Ledger {
    /// A ledger for `blocks` blocks of `bs` bytes, all stamped with generation 0.
    pub fn new(blocks: u64, bs: usize) -> Ledger {
        Ledger {
            bs,
            acked: vec![Some(0); blocks as usize],
            busy: vec![false; blocks as usize],
            next_generation: 1,
        }
    }

    /// A ledger for `blocks` blocks of `bs` bytes whose contents are unknown (a disk this run
    /// did not stamp): a read of a block not written yet may hold no stamp, or any valid stamp
    /// for its offset.
    pub fn unknown(blocks: u64, bs: usize) -> Ledger {
        Ledger {
            acked: vec![None; blocks as usize],
            ..Ledger::new(blocks, bs)
        }
    }

    /// Judges a successful read of `block` at `offset` whose stamp check gave `stamp`.
    pub fn judge(
        &self,
        block: u64,
        offset: u64,
        stamp: Result<u64, VerifyError>,
    ) -> Result<(), VerifyError> {
        match (stamp?, self.acked[block as usize]) {
            (found, Some(expected)) if found != expected => Err(VerifyError::Stale {
                offset,
                expected,
                found,
            }),
            _ => Ok(()),
        }
    }

    /// `start`, or the first block after it (wrapping) with no request in flight; `None` when
    /// every block is busy.
    pub fn free_block_from(&self, start: u64) -> Option<u64> {
        let n = self.busy.len() as u64;
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&b| !self.busy[b as usize])
    }

    /// A request on free `block` at `offset` begins, its buffer `mem`: the block is busy; a
    /// write gets the next generation, stamped into `mem`; a read's `mem` loses any earlier
    /// stamp (a read that transfers nothing must not pass on another request's). Returns the
    /// write's generation (0 for a read or a trim).
    pub fn begin(&mut self, block: u64, direction: Direction, offset: u64, mem: &mut [u8]) -> u64 {
        self.busy[block as usize] = true;
        match direction {
            Direction::Write => {
                let generation = self.next_generation;
                self.next_generation += 1;
                stamp(mem, offset, generation);
                generation
            }
            Direction::Read => {
                mem[..8].fill(0);
                0
            }
            Direction::Trim => 0,
        }
    }

    /// The request on `block` at `offset` finished (`ok`: it succeeded): the block is free
    /// again; an acknowledged write's `generation` is what the block holds now, a failed
    /// write or any trim leaves it unknown; a successful read's buffer `read` is judged.
    /// Returns the read's verdict (`None` for anything else).
    ///
    /// # Panics
    ///
    /// If a successful read comes without its buffer (a bug of the caller).
    pub fn finish(
        &mut self,
        block: u64,
        direction: Direction,
        generation: u64,
        ok: bool,
        offset: u64,
        read: Option<&[u8]>,
    ) -> Option<ReadVerdict> {
        let b = block as usize;
        self.busy[b] = false;
        match direction {
            Direction::Write => self.acked[b] = ok.then_some(generation),
            Direction::Trim => self.acked[b] = None,
            Direction::Read => {}
        }
        if !ok || direction != Direction::Read {
            return None;
        }
        let read = read.expect("a successful read's buffer, to check it");
        let stamp = check(read, offset);
        Some(match (self.acked[b], stamp) {
            (None, Err(VerifyError::NotStamped { .. })) => ReadVerdict::Unstamped,
            (_, stamp) => match self.judge(block, offset, stamp) {
                Ok(()) => ReadVerdict::Verified,
                Err(e) => ReadVerdict::Mismatch(e),
            },
        })
    }
}

/// What a read of a stamped disk found, judged by the [`Ledger`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadVerdict {
    /// The block held the stamp the ledger expects (or, where it knows nothing, a valid
    /// stamp for its offset).
    Verified,
    /// A block whose contents the ledger does not know held no stamp: accepted.
    Unstamped,
    /// It held something else.
    Mismatch(VerifyError),
}

fn crc(block: &[u8]) -> u32 {
    let c = crc32c::crc32c(&block[8..24]);
    crc32c::crc32c_append(c, &block[HEADER..])
}

/// Stamps `block` (at least [`HEADER`] bytes, a multiple of 8) for `offset` and `generation`.
pub fn stamp(block: &mut [u8], offset: u64, generation: u64) {
    assert!(block.len() >= HEADER && block.len() % 8 == 0);
    block[..8].copy_from_slice(MAGIC);
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&generation.to_le_bytes());
    block[28..32].fill(0);
    let mut x = (offset ^ generation.rotate_left(32)) | 1;
    for word in block[HEADER..].chunks_exact_mut(8) {
        // xorshift: cheap, and a different payload per offset and generation.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    let c = crc(block);
    block[24..28].copy_from_slice(&c.to_le_bytes());
}

/// Checks that `block` is a valid stamp for `offset` and returns its generation.
pub fn check(block: &[u8], offset: u64) -> Result<u64, VerifyError> {
    if block.len() < HEADER || &block[..8] != MAGIC {
        return Err(VerifyError::NotStamped { offset });
    }
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(block[r].try_into().expect("8"));
    let (found, generation) = (word(8..16), word(16..24));
    let stored = u32::from_le_bytes(block[24..28].try_into().expect("4"));
    if stored != crc(block) {
        return Err(VerifyError::Corrupt { offset, generation });
    }
    if found != offset {
        return Err(VerifyError::WrongOffset { offset, found });
    }
    Ok(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_block_is_the_one_asked_for_or_the_next_free_one() {
        let mut l = Ledger::new(8, 4096);
        assert_eq!(l.free_block_from(5), Some(5));
        l.busy[5] = true;
        assert_eq!(l.free_block_from(5), Some(6));
        l.busy[6] = true;
        l.busy[7] = true;
        assert_eq!(l.free_block_from(6), Some(0), "wraps around");
        l.busy.fill(true);
        assert_eq!(l.free_block_from(3), None);
    }

    #[test]
    fn each_write_gets_a_new_generation_and_a_read_judges_the_last_one_acknowledged() {
        let mut l = Ledger::new(4, 64);
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        let g1 = l.begin(2, Direction::Write, 128, &mut a);
        assert!(l.finish(2, Direction::Write, g1, true, 128, None).is_none());
        let g2 = l.begin(2, Direction::Write, 128, &mut b);
        assert!(g2 > g1, "generations {g1}, {g2}");
        l.finish(2, Direction::Write, g2, true, 128, None);
        // The second write was lost: the block still holds the first.
        l.begin(2, Direction::Read, 128, &mut [0u8; 64]);
        let verdict = l.finish(2, Direction::Read, 0, true, 128, Some(&a));
        assert!(matches!(
            verdict,
            Some(ReadVerdict::Mismatch(VerifyError::Stale { .. }))
        ));
        l.begin(2, Direction::Read, 128, &mut [0u8; 64]);
        assert_eq!(
            l.finish(2, Direction::Read, 0, true, 128, Some(&b)),
            Some(ReadVerdict::Verified)
        );
        // A failed read is not judged, and wants no buffer.
        l.begin(2, Direction::Read, 128, &mut [0u8; 64]);
        assert_eq!(l.finish(2, Direction::Read, 0, false, 128, None), None);
        assert!(l.busy.iter().all(|b| !b));
    }

    #[test]
    fn a_block_of_just_the_header_is_stamped_and_a_shorter_one_is_not() {
        let mut b = vec![0u8; HEADER];
        stamp(&mut b, 4096, 3);
        assert_eq!(check(&b, 4096), Ok(3));
        assert_eq!(
            check(&b[..HEADER - 8], 4096),
            Err(VerifyError::NotStamped { offset: 4096 })
        );
    }

    #[test]
    fn a_stamp_checks_and_every_kind_of_damage_is_named() {
        let mut b = vec![0u8; 4096];
        assert_eq!(check(&b, 0), Err(VerifyError::NotStamped { offset: 0 }));
        stamp(&mut b, 8192, 7);
        assert_eq!(check(&b, 8192), Ok(7));
        assert_eq!(
            check(&b, 4096),
            Err(VerifyError::WrongOffset {
                offset: 4096,
                found: 8192
            })
        );
        let mut torn = b.clone();
        torn[2048] ^= 1;
        assert_eq!(
            check(&torn, 8192),
            Err(VerifyError::Corrupt {
                offset: 8192,
                generation: 7
            })
        );
        let mut other = vec![0u8; 4096];
        stamp(&mut other, 8192, 8);
        assert_ne!(
            b[HEADER..],
            other[HEADER..],
            "payload depends on generation"
        );
        // Half of one generation, half of the next: torn, caught by the crc.
        let mut mixed = b.clone();
        mixed[2048..].copy_from_slice(&other[2048..]);
        assert!(matches!(
            check(&mixed, 8192),
            Err(VerifyError::Corrupt { .. })
        ));
    }
}
