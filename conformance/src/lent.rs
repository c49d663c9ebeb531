//! The lent-memory part of the engine conformance suite: reads and writes straight into and
//! out of memory the caller lends ([`LentMemory`]), the alignment `O_DIRECT` asks of it, and
//! how long the engine keeps its hold.
//!
//! This module owns those tests and their fixture (a region of guest RAM);
//! [`engine_conformance!`](crate::engine_conformance) runs them with the rest.

use std::any::Any;
use std::sync::{Arc, Weak};

use super::fixtures::{wait_for, Rng, TempFile, BLOCK};
use aio_core::engine::{AlignedBuf, IoEngine, LentMemory, MemoryHold, Request, RequestError};
use aio_core::EventLoop;

/// Caller-owned memory that a test hands out as guest RAM.
struct GuestRam {
    mem: AlignedBuf,
}

impl GuestRam {
    /// `len` bytes at `offset` of the region, for one request.
    fn iovecs(&mut self, offset: usize, len: usize) -> LentMemory {
        self.held(offset, len, None)
    }

    /// `len` bytes at `offset` of the region, for one request, with `hold` kept with them.
    fn held(&mut self, offset: usize, len: usize, hold: Option<MemoryHold>) -> LentMemory {
        assert!(offset + len <= self.mem.len());
        let base = self.mem.as_mut_ptr().wrapping_add(offset);
        // SAFETY: the segment lies inside `mem`, which outlives every request of the test
        // (each test waits for all its completions, or drops the engine, before `GuestRam` is
        // dropped), and the test touches a segment only after the request using it has
        // completed.
        unsafe { LentMemory::new([(base, len)], hold) }
    }
}

/// Guest-memory writes and reads at many offsets inside one region, at QD 1 and QD 32, mixed
/// with `AlignedBuf` requests on the same engine: every byte checked.
pub fn guest_memory_reads_and_writes_at_many_offsets<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    const BLOCKS: usize = 64;
    let tmp = TempFile::with_len(BLOCKS * BLOCK, 0);
    let file = tmp.open_direct_or_say();
    let mut rng = Rng::new(14);
    let mut ram = GuestRam {
        mem: rng.buf(2 * BLOCKS * BLOCK),
    };
    let expected: Vec<u8> = ram.mem[..BLOCKS * BLOCK].to_vec();
    for depth in [1, 32] {
        // Guest block g (in the first half of the region) goes to file block BLOCKS-1-g; every
        // fourth one through an AlignedBuf copy instead.
        let mut token = 0;
        for chunk in (0..BLOCKS).collect::<Vec<_>>().chunks(depth) {
            engine.plug();
            for &g in chunk {
                let at = ((BLOCKS - 1 - g) * BLOCK) as u64;
                let r = if g % 4 == 3 {
                    let buf = AlignedBuf::from_slice(&expected[g * BLOCK..(g + 1) * BLOCK]);
                    Request::write(&file, at, buf, token)
                } else {
                    Request::write_guest(&file, at, ram.iovecs(g * BLOCK, BLOCK), token)
                };
                engine.submit(r).expect("submit write");
                token += 1;
            }
            engine.unplug();
            for c in wait_for(&mut engine, chunk.len()) {
                assert_eq!(c.result.as_ref().ok(), Some(&BLOCK), "{c:?}");
            }
        }
        // Read the file back into the second half, in two-segment requests of two blocks.
        let half = BLOCKS * BLOCK;
        ram.mem[half..].fill(0);
        let pairs: Vec<usize> = (0..BLOCKS / 2).collect();
        for chunk in pairs.chunks(depth) {
            for &p in chunk {
                let base = ram.mem.as_mut_ptr().wrapping_add(half + 2 * p * BLOCK);
                let segs = [(base.wrapping_add(BLOCK), BLOCK), (base, BLOCK)];
                // SAFETY: both segments lie in the second half of `mem`, untouched until the
                // completions below; `ram` outlives them.
                let mem = unsafe { LentMemory::new(segs, None) };
                let r = Request::read_guest(&file, (2 * p * BLOCK) as u64, mem, p as u64);
                engine.submit(r).expect("submit read");
            }
            for c in wait_for(&mut engine, chunk.len()) {
                assert_eq!(c.result.as_ref().ok(), Some(&(2 * BLOCK)));
                let back = c.buf.into_guest().expect("the lent memory comes back");
                assert_eq!(back.count(), 2);
            }
        }
        // File block b holds guest block BLOCKS-1-b; the read swapped each pair of blocks.
        for p in 0..BLOCKS / 2 {
            for (file_block, slot) in [(2 * p, 2 * p + 1), (2 * p + 1, 2 * p)] {
                let g = BLOCKS - 1 - file_block;
                let got = &ram.mem[half + slot * BLOCK..half + (slot + 1) * BLOCK];
                assert!(
                    got == &expected[g * BLOCK..(g + 1) * BLOCK],
                    "depth {depth}: file block {file_block} read wrong"
                );
            }
        }
    }
    assert_eq!(engine.in_flight(), 0);
}

/// A guest iovec that breaks `O_DIRECT` alignment is refused at `submit`, typed, with the
/// request handed back; the engine goes on.
pub fn misaligned_guest_iovec_is_refused_at_submit<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(4 * BLOCK, 1);
    let Ok(file) = tmp.open(libc::O_DIRECT) else {
        return super::skip("O_DIRECT is not supported in the temp dir");
    };
    let mut ram = GuestRam {
        mem: AlignedBuf::new(4 * BLOCK),
    };
    let e = engine
        .submit(Request::read_guest(&file, 0, ram.iovecs(1, BLOCK), 5))
        .expect_err("misaligned address");
    assert!(
        matches!(e.error, RequestError::Misaligned { .. }),
        "{}",
        e.error
    );
    assert_eq!(e.request.token, 5);
    assert!(e.request.op.into_buffers().into_guest().is_some());
    let e = engine
        .submit(Request::write_guest(&file, 100, ram.iovecs(0, BLOCK), 6))
        .expect_err("misaligned offset");
    assert!(matches!(e.error, RequestError::Misaligned { .. }));
    assert_eq!(engine.in_flight(), 0);
    engine
        .submit(Request::read_guest(&file, 0, ram.iovecs(0, BLOCK), 7))
        .unwrap();
    let done = wait_for(&mut engine, 1);
    assert_eq!(done[0].result.as_ref().ok(), Some(&BLOCK));
    assert!(ram.mem[..BLOCK].iter().all(|&b| b == 1));
}

/// A hold that says when the last clone of it is gone.
fn watched() -> (MemoryHold, Weak<dyn Any + Send + Sync>) {
    let hold: MemoryHold = Arc::new(());
    let weak = Arc::downgrade(&hold);
    (hold, weak)
}

/// Lent memory's hold lives exactly as long as the memory is the engine's: every request not
/// yet handed back still holds it, each completion hands it back with the memory, the engine
/// keeps no clone, and an engine dropped with lent memory in flight releases every hold once
/// its drop has waited. At QD 32, reads and then writes, with `O_DIRECT` where the file system
/// takes it.
pub fn lent_memory_is_held_until_its_completion_hands_it_back<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    const N: usize = 32;
    let tmp = TempFile::with_len(N * BLOCK, 3);
    let file = tmp.open_direct_or_say();
    let mut ram = GuestRam {
        mem: AlignedBuf::new(N * BLOCK),
    };
    let mut engine_a = engine();
    let mut watch = Vec::new();
    for t in 0..N {
        let (hold, weak) = watched();
        let mem = ram.held(t * BLOCK, BLOCK, Some(hold));
        let at = (t * BLOCK) as u64;
        engine_a
            .submit(Request::read_guest(&file, at, mem, t as u64))
            .expect("submit read");
        watch.push(weak);
    }
    let mut back = [false; N];
    for _ in 0..N {
        for (t, w) in watch.iter().enumerate() {
            let held = w.strong_count();
            assert!(back[t] || held == 1, "request {t} in flight holds {held}");
        }
        for c in wait_for(&mut engine_a, 1) {
            let t = c.token as usize;
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK), "{c:?}");
            assert_eq!(
                watch[t].strong_count(),
                1,
                "request {t}: handed back with its hold"
            );
            let mem = c.buf.into_guest().expect("the lent memory comes back");
            assert!(mem.hold().is_some());
            drop(mem);
            assert_eq!(
                watch[t].strong_count(),
                0,
                "request {t}: the engine kept a clone"
            );
            back[t] = true;
        }
        if back.iter().all(|&b| b) {
            break;
        }
    }
    assert!(back.iter().all(|&b| b), "every read came back");
    assert!(
        ram.mem.iter().all(|&b| b == 3),
        "the reads landed in the lent memory"
    );
    drop(engine_a);
    // Writes in flight when their engine is dropped: the drop waits, then lets every hold go.
    ram.mem.fill(9);
    let mut engine_b = engine();
    let mut watch = Vec::new();
    for t in 0..N {
        let (hold, weak) = watched();
        let mem = ram.held(t * BLOCK, BLOCK, Some(hold));
        let at = (t * BLOCK) as u64;
        engine_b
            .submit(Request::write_guest(&file, at, mem, t as u64))
            .expect("submit write");
        watch.push(weak);
    }
    drop(engine_b);
    for (t, w) in watch.iter().enumerate() {
        assert_eq!(
            w.strong_count(),
            0,
            "write {t}: its hold outlived the engine"
        );
    }
}
