//! The block-device part of the engine conformance suite: a loop device (`losetup
//! --direct-io=on` over a file in the temp dir) takes discard, write-zeroes, random writes,
//! vectored writes and fsync through each engine. Without root or loop devices these tests say
//! `skipped:` with the reason.
//!
//! This module owns those tests, never a fixture (the loop device is
//! [`TempFile::on_a_loop_device`]).

use super::disk::{blocks_of, run_range_op};
use super::fixtures::{wait_for, Rng, TempFile, BLOCK};
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request};
use aio_core::EventLoop;

/// A loop device takes discard and write-zeroes (`BLKDISCARD`, the kernel's zero-out): the
/// ranges read back as zeroes through the device, the rest is untouched, and a discard frees
/// the backing file's blocks.
pub fn block_device_takes_discard_and_write_zeroes<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    const MIB: usize = 1 << 20;
    let dev = match TempFile::on_a_loop_device(8 * MIB, 0x33) {
        Ok(d) => d,
        Err(reason) => return super::skip(&format!("no loop device: {reason}")),
    };
    let mut engine = engine();
    let file = dev.open(libc::O_DIRECT).expect("open the loop device");
    assert_eq!(file.kind(), aio_core::engine::FileKind::BlockDevice);
    let full = blocks_of(dev.backing());
    // io_uring runs no ioctl: plain, it refuses a block device's discard (typed, checked by
    // `run_range_op`) and still runs write-zeroes.
    let discarded = run_range_op(&mut engine, Request::discard(&file, 0, MIB as u64, 1));
    if let Some(done) = &discarded {
        assert_eq!(done.result.as_ref().ok(), Some(&MIB), "{done:?}");
        assert!(
            blocks_of(dev.backing()) < full,
            "the backing file's blocks are freed"
        );
    }
    for (i, unmap) in [(1, false), (2, true)] {
        let r = Request::write_zeroes(&file, (i * MIB) as u64, MIB as u64, unmap, 2 + i as u64);
        let Some(done) = run_range_op(&mut engine, r) else {
            return;
        };
        assert_eq!(
            done.result.as_ref().ok(),
            Some(&MIB),
            "unmap {unmap}: {done:?}"
        );
    }
    for block in 0..4 {
        let at = (block * MIB) as u64;
        engine
            .submit(Request::read(
                &file,
                at,
                AlignedBuf::new(BLOCK),
                10 + block as u64,
            ))
            .unwrap();
        let done = wait_for(&mut engine, 1);
        let zeroed = (block == 0 && discarded.is_some()) || block == 1 || block == 2;
        let want = if zeroed { 0 } else { 0x33 };
        let buf = done[0].buf.first().unwrap();
        assert!(
            buf.iter().all(|&b| b == want),
            "block at {at}: want {want:#x}"
        );
    }
}

/// A loop device (`O_DIRECT` over direct I/O) takes writes at random offsets at QD 64, vectored
/// writes and an fsync, and reads them back; the backing file holds the same bytes.
pub fn block_device_reads_and_writes_at_random_offsets<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    const BLOCKS: u64 = 1024;
    let dev = match TempFile::on_a_loop_device(BLOCKS as usize * BLOCK, 0) {
        Ok(d) => d,
        Err(reason) => return super::skip(&format!("no loop device: {reason}")),
    };
    let mut engine = engine();
    let file = dev.open(libc::O_DIRECT).expect("open the loop device");
    let mut rng = Rng::new(17);
    let mut blocks: Vec<u64> = (0..BLOCKS).collect();
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    blocks.truncate(128);
    let data: Vec<AlignedBuf> = blocks.iter().map(|_| rng.buf(BLOCK)).collect();
    engine.plug();
    for (i, (&b, d)) in blocks.iter().zip(&data).enumerate().take(64) {
        let r = Request::write(&file, b * BLOCK as u64, d.clone(), i as u64);
        engine.submit(r).unwrap();
    }
    engine.unplug();
    for c in wait_for(&mut engine, 64) {
        assert!(c.result.is_ok(), "write {}: {:?}", c.token, c.result);
    }
    // Then the other 64 buffers as 32 two-block writev requests, at blocks 14k and 14k + 1
    // (disjoint pairs, some over blocks written above: these come later, so they win).
    let pairs: Vec<u64> = (0..32).map(|k| 14 * k).collect();
    for (k, &at) in pairs.iter().enumerate() {
        let bufs = vec![data[64 + 2 * k].clone(), data[64 + 2 * k + 1].clone()];
        engine
            .submit(Request::writev(
                &file,
                at * BLOCK as u64,
                bufs,
                1000 + k as u64,
            ))
            .unwrap();
    }
    for c in wait_for(&mut engine, pairs.len()) {
        assert_eq!(
            c.result.as_ref().ok(),
            Some(&(2 * BLOCK)),
            "writev {}",
            c.token
        );
    }
    engine.submit(Request::fsync(&file, 5000)).unwrap();
    assert!(wait_for(&mut engine, 1)[0].result.is_ok());
    // What each block should hold now.
    let mut expect = std::collections::HashMap::new();
    for (i, &b) in blocks.iter().enumerate().take(64) {
        expect.insert(b, i);
    }
    for (k, &at) in pairs.iter().enumerate() {
        expect.insert(at, 64 + 2 * k);
        expect.insert(at + 1, 64 + 2 * k + 1);
    }
    read_back_and_compare(&mut engine, &file, &dev, &data, &expect);
}

/// Reads every block of `expect` back through `engine` (64 at a time) and from `dev`'s backing
/// file, each against `data[expect[block]]`.
fn read_back_and_compare<E: IoEngine>(
    engine: &mut E,
    file: &IoFile,
    dev: &TempFile,
    data: &[AlignedBuf],
    expect: &std::collections::HashMap<u64, usize>,
) {
    let reads: Vec<u64> = expect.keys().copied().collect();
    for chunk in reads.chunks(64) {
        for &b in chunk {
            let r = Request::read(file, b * BLOCK as u64, AlignedBuf::new(BLOCK), b);
            engine.submit(r).unwrap();
        }
        for c in wait_for(engine, chunk.len()) {
            let want = &data[expect[&c.token]];
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK));
            assert!(
                c.buf.first().unwrap() == want,
                "block {} read back wrong",
                c.token
            );
        }
    }
    let backing = std::fs::read(dev.backing()).unwrap();
    for (&b, &i) in expect {
        let at = b as usize * BLOCK;
        assert!(
            backing[at..at + BLOCK] == data[i][..],
            "block {b} in the backing file"
        );
    }
}
