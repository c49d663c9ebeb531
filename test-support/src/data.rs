//! Data a test writes and reads back: a stamp that names where the bytes belong and which
//! write put them there, so that data read from the wrong place, or a stale write's, differs
//! from what is expected.
//!
//! This module owns the stamp's bytes; where a test writes them and what it compares is the
//! test's.

/// Mixes the generation into every word (an odd constant: distinct generations stay distinct).
const GENERATION_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// Fills `buf`, the bytes at `offset` on a disk, for write `generation`: every 8-byte word is
/// its own offset mixed with the generation (a last partial word keeps its first bytes). The
/// same `offset` and `generation` always give the same bytes; another offset or generation
/// gives others.
pub fn stamp(buf: &mut [u8], offset: u64, generation: u64) {
    let mix = generation.wrapping_mul(GENERATION_MIX);
    for (i, word) in buf.chunks_mut(8).enumerate() {
        let v = (offset + 8 * i as u64) ^ mix;
        word.copy_from_slice(&v.to_le_bytes()[..word.len()]);
    }
}

/// A new buffer of `len` bytes stamped for `offset` and `generation` (see [`stamp`]).
pub fn stamped(len: usize, offset: u64, generation: u64) -> Vec<u8> {
    let mut buf = vec![0; len];
    stamp(&mut buf, offset, generation);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_names_its_offset_and_generation() {
        let a = stamped(4096, 8192, 1);
        assert_eq!(a, stamped(4096, 8192, 1));
        assert_ne!(a, stamped(4096, 8192, 2), "another generation");
        assert_ne!(a, stamped(4096, 4096, 1), "another offset");
        assert_ne!(
            stamped(64, 0, 0),
            vec![0; 64],
            "generation 0 at offset 0 too"
        );
        let words: std::collections::HashSet<_> = a.chunks(8).collect();
        assert_eq!(words.len(), 512, "every word differs from the others");
        let mut short = [0u8; 12];
        stamp(&mut short, 8192, 1);
        assert_eq!(short[..], a[..12], "a partial word keeps its first bytes");
    }
}
