//! What a job's requests are and where they go: fio's `rw=` patterns and the offset stream.
//!
//! This module owns the patterns' names (fio's), their direction (read, write or trim) and the
//! deterministic stream of block offsets shared by the job runner and the matrix's guest. It
//! issues no I/O.

use std::fmt;
use std::str::FromStr;

/// The I/O pattern of a job (fio's `rw=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Sequential discards of `bs`-sized blocks (fio `rw=trim`).
    Trim,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random discards of `bs`-sized blocks (fio `rw=randtrim`).
    RandTrim,
    /// Sequential reads and writes, mixed by `rwmixread` (fio `rw=rw` or `readwrite`).
    ReadWrite,
    /// Random reads and writes, mixed by `rwmixread` (fio `rw=randrw`).
    RandReadWrite,
}

/// Which way one request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A read.
    Read,
    /// A write.
    Write,
    /// A discard (fio's trim).
    Trim,
}

impl Pattern {
    /// Every pattern, in fio's order.
    pub const ALL: [Pattern; 8] = [
        Pattern::Read,
        Pattern::Write,
        Pattern::Trim,
        Pattern::RandRead,
        Pattern::RandWrite,
        Pattern::RandTrim,
        Pattern::ReadWrite,
        Pattern::RandReadWrite,
    ];

    /// fio's name for the pattern.
    pub fn fio_name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::Trim => "trim",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::RandTrim => "randtrim",
            Pattern::ReadWrite => "rw",
            Pattern::RandReadWrite => "randrw",
        }
    }

    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Pattern::RandRead | Pattern::RandWrite | Pattern::RandTrim | Pattern::RandReadWrite
        )
    }

    /// Whether the requests are discards (fio's `trim` and `randtrim`).
    pub fn is_trim(self) -> bool {
        matches!(self, Pattern::Trim | Pattern::RandTrim)
    }

    /// Whether the pattern changes the file (writes or discards): its file must be opened
    /// for writing.
    pub fn modifies(self, rwmixread: u8) -> bool {
        self.is_trim() || self.read_percent(rwmixread) < 100
    }

    /// The percentage of requests that read, given a mixed job's `rwmixread` (0 for trims).
    pub fn read_percent(self, rwmixread: u8) -> u8 {
        match self {
            Pattern::Read | Pattern::RandRead => 100,
            Pattern::Write | Pattern::RandWrite | Pattern::Trim | Pattern::RandTrim => 0,
            Pattern::ReadWrite | Pattern::RandReadWrite => rwmixread.min(100),
        }
    }

    /// The sections of fio's JSON output that carry the pattern's figures, given a mixed job's
    /// `rwmixread`: `read`, `write`, both, or `trim`.
    pub fn fio_sides(self, rwmixread: u8) -> &'static [&'static str] {
        if self.is_trim() {
            return &["trim"];
        }
        match self.read_percent(rwmixread) {
            100 => &["read"],
            0 => &["write"],
            _ => &["read", "write"],
        }
    }
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "readwrite" {
            return Ok(Pattern::ReadWrite);
        }
        Pattern::ALL
            .into_iter()
            .find(|p| p.fio_name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown pattern '{s}' (expected read, write, trim, randread, randwrite, randtrim, rw, readwrite or randrw)"
                )
            })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.fio_name())
    }
}

/// Where the next request goes and which way: the offset stream of a job, shared by the job
/// runner and the matrix's guest.
#[derive(Debug, Clone)]
pub struct OffsetStream {
    trim: bool,
    read_percent: u8,
    random: bool,
    blocks: u64,
    next_seq: u64,
    rng: fastrand::Rng,
}

impl OffsetStream {
    /// A stream over `blocks` blocks (at least one).
    pub fn new(pattern: Pattern, rwmixread: u8, blocks: u64, seed: u64) -> Self {
        OffsetStream {
            trim: pattern.is_trim(),
            read_percent: pattern.read_percent(rwmixread),
            random: pattern.is_random(),
            blocks: blocks.max(1),
            next_seq: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The next block index.
    pub fn next_block(&mut self) -> u64 {
        if self.random {
            self.rng.u64(..self.blocks)
        } else {
            let b = self.next_seq % self.blocks;
            self.next_seq += 1;
            b
        }
    }

    /// Which way the next request goes.
    pub fn next_direction(&mut self) -> Direction {
        if self.trim {
            return Direction::Trim;
        }
        match self.read_percent {
            100 => Direction::Read,
            0 => Direction::Write,
            p if self.rng.u8(..100) >= p => Direction::Write,
            _ => Direction::Read,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_trims_are_their_own_direction() {
        for p in Pattern::ALL {
            assert_eq!(p.fio_name().parse::<Pattern>(), Ok(p));
        }
        assert!("trimwrite".parse::<Pattern>().is_err());
        let mut s = OffsetStream::new(Pattern::RandTrim, 50, 16, 7);
        assert!((0..100).all(|_| s.next_direction() == Direction::Trim));
        assert_eq!(Pattern::RandTrim.fio_sides(50), ["trim"]);
        assert_eq!(Pattern::RandReadWrite.fio_sides(50), ["read", "write"]);
        assert!(Pattern::Trim.modifies(100) && !Pattern::Read.modifies(0));
        let mut seq = OffsetStream::new(Pattern::Trim, 50, 3, 7);
        let blocks: Vec<u64> = (0..4).map(|_| seq.next_block()).collect();
        assert_eq!(blocks, [0, 1, 2, 0], "sequential trims wrap around");
    }
}
