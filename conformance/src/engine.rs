//! The engine conformance suite: every behavioural test of the [`IoEngine`] contract.
//!
//! This module owns the engine's own tests (reads, writes, batches, cancel, drain), never a
//! loop or the list of what runs (the macro, in `suite`): signals in the engine's waits and
//! drop with requests in flight are `interruptions`, the tests that attach the engine to an
//! [`AioContext`] live in `engine_loop`, the virtual-disk ops in `disk`, the fixtures in
//! `fixtures`. An engine crate
//! gets the whole suite with one line in `tests/conformance.rs`, naming the engine and a
//! monitor for the tests that run a loop:
//!
//! ```ignore
//! aio_conformance::engine_conformance!(MyEngine::new().unwrap(), aio_backend_poll::PollLoop::new());
//! ```
//!
//! Each invocation runs the suite twice: against files in the temp dir, and (in the module
//! `on_a_loop_device`) against loop devices over such files, where the tests run as root and
//! `losetup` works; elsewhere those say `skipped:` with the reason.
//!
//! [`AioContext`]: aio_loop::AioContext

use std::collections::VecDeque;
use std::fs::File;
use std::time::{Duration, Instant};

use super::fixtures::{ok, submit_all};
pub use super::fixtures::{
    read_block, requests_with_rw_flags, wait_for, wait_readable, Rng, TempFile, BLOCK,
};
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request};
use aio_core::EventLoop;

/// Writes at random block offsets, reads them back, and checks every byte.
pub fn write_then_read_at_random_offsets<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(256 * BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let mut rng = Rng::new(42);
    let mut blocks: Vec<u64> = (0..256).collect();
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    blocks.truncate(64);
    let data: Vec<AlignedBuf> = blocks.iter().map(|_| rng.buf(BLOCK)).collect();
    let writes = blocks
        .iter()
        .zip(&data)
        .enumerate()
        .map(|(i, (&b, d))| Request::write(&file, b * BLOCK as u64, d.clone(), i as u64))
        .collect();
    for c in submit_all(&mut engine, writes) {
        assert_eq!(ok(&c), BLOCK);
        assert_eq!(
            c.buf.into_one().unwrap(),
            data[c.token as usize],
            "buffer handed back"
        );
    }
    let reads = blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| Request::read(&file, b * BLOCK as u64, AlignedBuf::new(BLOCK), i as u64))
        .collect();
    for c in submit_all(&mut engine, reads) {
        assert_eq!(ok(&c), BLOCK);
        let i = c.token as usize;
        assert!(
            c.buf.into_one().unwrap() == data[i],
            "block {} differs",
            blocks[i]
        );
    }
    let content = tmp.contents();
    for (i, &b) in blocks.iter().enumerate() {
        let at = b as usize * BLOCK;
        assert_eq!(&content[at..at + BLOCK], &data[i][..], "on disk, block {b}");
    }
}

/// Vectored writes and reads, split differently, agree byte for byte.
pub fn readv_and_writev<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(8 * BLOCK, 0xee);
    let file = tmp.open(0).unwrap();
    let mut rng = Rng::new(7);
    let parts = vec![rng.buf(BLOCK), rng.buf(2 * BLOCK), rng.buf(BLOCK)];
    let whole: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
    let done = submit_all(
        &mut engine,
        vec![Request::writev(&file, 2 * BLOCK as u64, parts, 1)],
    );
    assert_eq!(ok(&done[0]), 4 * BLOCK);
    assert_eq!(done[0].buf.count(), 3);
    let done = submit_all(
        &mut engine,
        vec![Request::readv(
            &file,
            2 * BLOCK as u64,
            vec![AlignedBuf::new(3 * BLOCK), AlignedBuf::new(BLOCK)],
            2,
        )],
    );
    let c = done.into_iter().next().unwrap();
    assert_eq!(ok(&c), 4 * BLOCK);
    let back: Vec<u8> = c
        .buf
        .into_vec()
        .iter()
        .flat_map(|b| b.iter().copied())
        .collect();
    assert_eq!(back, whole);
    let content = tmp.contents();
    assert!(
        content[..2 * BLOCK].iter().all(|&b| b == 0xee),
        "nothing written before"
    );
    assert_eq!(&content[2 * BLOCK..6 * BLOCK], &whole[..]);
}

/// fsync and fdatasync complete with 0 after a write.
pub fn fsync_and_fdatasync<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let done = submit_all(
        &mut engine,
        vec![Request::write(
            &file,
            0,
            AlignedBuf::from_slice(&[9; BLOCK]),
            0,
        )],
    );
    assert_eq!(ok(&done[0]), BLOCK);
    let done = submit_all(
        &mut engine,
        vec![Request::fsync(&file, 1), Request::fdatasync(&file, 2)],
    );
    assert_eq!([done[0].token, done[1].token], [1, 2]);
    for c in &done {
        assert_eq!(ok(c), 0);
        assert_eq!(c.buf.count(), 0);
    }
    assert!(tmp.contents().iter().all(|&b| b == 9));
}

fn open_direct(tmp: &TempFile) -> Option<IoFile> {
    match tmp.open(libc::O_DIRECT) {
        Ok(f) => Some(f),
        Err(e) => {
            super::skip(&format!(
                "O_DIRECT is not supported in {}: {e}",
                std::env::temp_dir().display()
            ));
            None
        }
    }
}

/// O_DIRECT reads and writes with `AlignedBuf`.
pub fn o_direct_with_aligned_buffers<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(16 * BLOCK, 0);
    let Some(file) = open_direct(&tmp) else {
        return;
    };
    let mut rng = Rng::new(99);
    let data: Vec<AlignedBuf> = (0..8).map(|_| rng.buf(BLOCK)).collect();
    let writes = data
        .iter()
        .enumerate()
        .map(|(i, d)| Request::write(&file, (2 * i * BLOCK) as u64, d.clone(), i as u64))
        .collect();
    for c in submit_all(&mut engine, writes) {
        assert_eq!(ok(&c), BLOCK);
    }
    let reads = (0..8)
        .map(|i| {
            Request::read(
                &file,
                (2 * i * BLOCK) as u64,
                AlignedBuf::new(BLOCK),
                i as u64,
            )
        })
        .collect();
    for c in submit_all(&mut engine, reads) {
        assert_eq!(ok(&c), BLOCK);
        assert!(c.buf.into_one().unwrap() == data[c.token as usize]);
    }
}

/// A read that crosses EOF returns the bytes that exist; one at or past EOF returns 0.
pub fn short_read_at_eof_and_read_past_eof<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(6000, 0x5a);
    let file = tmp.open(0).unwrap();
    let done = submit_all(
        &mut engine,
        vec![
            Request::read(&file, 4096, AlignedBuf::new(BLOCK), 0),
            Request::read(&file, 6000, AlignedBuf::new(BLOCK), 1),
            Request::read(&file, 1 << 20, AlignedBuf::new(BLOCK), 2),
            Request::readv(
                &file,
                5000,
                vec![AlignedBuf::new(512), AlignedBuf::new(BLOCK)],
                3,
            ),
        ],
    );
    assert_eq!(ok(&done[0]), 6000 - 4096);
    let b = done[0].buf.first().expect("one buffer");
    assert!(b[..6000 - 4096].iter().all(|&x| x == 0x5a));
    assert_eq!(ok(&done[1]), 0);
    assert_eq!(ok(&done[2]), 0);
    assert_eq!(ok(&done[3]), 1000);
}

/// Kernel errors arrive per request, with the errno, and the rest of the batch completes.
pub fn errors_are_per_request_and_the_batch_completes<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(4 * BLOCK, 1);
    let rw = tmp.open(0).unwrap();
    let ro = tmp.open_read_only();
    let dir = IoFile::from(File::open(std::env::temp_dir()).unwrap());
    let requests = vec![
        Request::read(&rw, 0, AlignedBuf::new(BLOCK), 0),
        Request::write(&ro, 0, AlignedBuf::new(BLOCK), 1),
        Request::read(&dir, 0, AlignedBuf::new(BLOCK), 2),
        Request::read(&rw, BLOCK as u64, AlignedBuf::new(BLOCK), 3),
    ];
    let done = submit_all(&mut engine, requests);
    assert_eq!(ok(&done[0]), BLOCK);
    assert_eq!(
        done[1].errno(),
        Some(libc::EBADF),
        "write on a read-only fd"
    );
    assert!(
        matches!(done[2].errno(), Some(libc::EISDIR) | Some(libc::EINVAL)),
        "read of a directory: {:?}",
        done[2].result
    );
    assert_eq!(ok(&done[3]), BLOCK);
    for c in &done {
        assert_eq!(c.buf.count(), 1, "buffers come back with errors too");
    }
}

/// 10,000 requests at depths 1, 32 and 256: each completes exactly once with its token.
pub fn ten_thousand_requests_complete_exactly_once<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(64 * BLOCK, 3);
    let file = tmp.open(0).unwrap();
    let mut seen = vec![0u8; 10_000];
    let mut next = 0u64;
    let mut rng = Rng::new(5);
    for (depth, count) in [(1usize, 500u64), (32, 1500), (256, 8000)] {
        let end = next + count;
        let mut in_flight = 0;
        let mut out = VecDeque::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while next < end || in_flight > 0 {
            while next < end && in_flight < depth {
                let block = rng.next_u64() % 64;
                let req = if next % 3 == 0 {
                    Request::write(
                        &file,
                        block * BLOCK as u64,
                        AlignedBuf::from_slice(&[3; BLOCK]),
                        next,
                    )
                } else {
                    read_block(&file, block, next)
                };
                engine.submit(req).expect("submit");
                next += 1;
                in_flight += 1;
            }
            out.clear();
            if engine.poll_completions(&mut out) == 0 {
                assert!(Instant::now() < deadline, "stuck at depth {depth}");
                let got = wait_for(&mut engine, 1);
                out.extend(got);
            }
            for c in out.drain(..) {
                assert_eq!(ok(&c), BLOCK);
                seen[c.token as usize] += 1;
                in_flight -= 1;
            }
        }
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "a request completed twice or never"
    );
    assert_eq!(engine.in_flight(), 0);
}

/// A plugged engine sends a full batch (`set_max_batch`) without waiting for `unplug`, as
/// QEMU's Linux AIO plug does: a plug never holds more than one batch. 64 requests in batches
/// of at most 4 all complete while the plug is still held (the first few go by the batch
/// rule's growth from 1, the rest only as full batches); a plug that held them until
/// `unplug` would leave the wait without completions.
pub fn plug_releases_a_full_batch<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(64 * BLOCK, 4);
    let file = tmp.open(0).unwrap();
    engine.set_max_batch(4);
    engine.plug();
    for t in 0..64 {
        engine.submit(read_block(&file, t, t)).unwrap();
    }
    let mut out = VecDeque::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < 64 {
        assert!(
            Instant::now() < deadline,
            "{} of 64 while plugged: the plug holds full batches back",
            out.len()
        );
        if engine.poll_completions(&mut out) == 0 {
            std::thread::yield_now();
        }
    }
    engine.unplug();
    assert_eq!(engine.in_flight(), 0);
}

/// A request cancelled while queued (plugged) ends with ECANCELED; the others complete.
pub fn cancel_of_a_queued_request_ends_with_ecanceled<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(4 * BLOCK, 2);
    let file = tmp.open(0).unwrap();
    engine.set_max_batch(8);
    engine.plug();
    // The batch rule: the idle device gets batches of 1 and 1; with 2 in the kernel the
    // third request waits for a batch of 2.
    for t in 0..3 {
        engine.submit(read_block(&file, t, t)).unwrap();
    }
    assert!(engine.cancel(2), "the third request is held by the plug");
    assert!(!engine.cancel(2), "already cancelled");
    assert!(!engine.cancel(77), "unknown token");
    engine.submit(read_block(&file, 3, 3)).unwrap();
    engine.unplug();
    let mut done = wait_for(&mut engine, 4);
    done.sort_by_key(|c| c.token);
    assert_eq!(done.len(), 4);
    assert_eq!(done[2].errno(), Some(libc::ECANCELED));
    assert_eq!(
        done[2].buf.count(),
        1,
        "the cancelled request's buffer comes back"
    );
    for i in [0, 1, 3] {
        assert_eq!(ok(&done[i]), BLOCK);
    }
    assert_eq!(engine.in_flight(), 0);
}

/// `drain` waits for everything in flight and hands every buffer back.
pub fn drain_hands_every_buffer_back<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(256 * BLOCK, 4);
    let file = tmp.open(0).unwrap();
    for t in 0..256u64 {
        engine.submit(read_block(&file, t, t)).unwrap();
    }
    let done = engine.drain();
    assert_eq!(done.len(), 256);
    assert_eq!(engine.in_flight(), 0);
    let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..256).collect::<Vec<_>>());
    for c in done {
        assert_eq!(ok(&c), BLOCK);
        assert!(c.buf.into_one().unwrap().iter().all(|&b| b == 4));
    }
    // Drained while plugged: the requests the plug holds back are sent, not cancelled.
    engine.set_max_batch(256);
    engine.plug();
    for t in 0..16u64 {
        engine.submit(read_block(&file, t, 1000 + t)).unwrap();
    }
    let done = engine.drain();
    assert_eq!(engine.in_flight(), 0);
    let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(
        tokens,
        (1000..1016).collect::<Vec<_>>(),
        "drained while plugged"
    );
    for c in &done {
        assert_eq!(ok(c), BLOCK);
    }
    engine.unplug();
    assert_eq!(engine.in_flight(), 0);
}
