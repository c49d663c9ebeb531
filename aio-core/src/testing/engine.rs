//! The engine conformance suite: every behavioural test of the [`IoEngine`] contract.
//!
//! This module owns the engine tests and their fixtures (temporary files in the system temp
//! dir, a completion waiter). An engine crate gets the whole suite with one line in
//! `tests/conformance.rs`, naming the engine and a monitor for the tests that attach the engine
//! to an [`AioContext`]:
//!
//! ```ignore
//! aio_core::engine_conformance!(MyEngine::new().unwrap(), aio_backend_poll::PollLoop::new());
//! ```

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::engine::{AlignedBuf, Completion, IoEngine, IoFile, Request, RequestError};
use crate::{AioContext, EventLoop};

/// Generates one `#[test]` per engine conformance test; `$engine` builds the engine and
/// `$monitor` the fd monitor for tests that run a loop. With `probe: $probe` (an expression
/// giving `Result<(), impl Display>`), each test first asks whether the kernel supports the
/// engine and, if not, reports `skipped: <reason>` (a failure under
/// `AIO_REQUIRE_ALL_BACKENDS=1`).
#[macro_export]
macro_rules! engine_conformance {
    (@tests ($probe:expr), $engine:expr, $monitor:expr; $module:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if $crate::testing::available(::std::stringify!($name), $probe).is_none() {
                    return;
                }
                $crate::testing::$module::$name(|| $engine, || $monitor);
            }
        )*
    };
    (probe: $probe:expr, $engine:expr, $monitor:expr) => {
        $crate::engine_conformance!(@tests ($probe), $engine, $monitor; disk:
            discard_and_write_zeroes_read_back_as_zeroes,
            discard_refused_by_the_file_system_is_a_typed_error,
            guest_memory_reads_and_writes_at_many_offsets,
            misaligned_guest_iovec_is_refused_at_submit,
            fua_and_nowait_requests_complete,
            per_request_callbacks_submit_from_inside,
            block_device_takes_discard_and_write_zeroes,
            block_device_reads_and_writes_at_random_offsets,
            writes_on_a_full_file_system_fail_alone,
        );
        $crate::engine_conformance!(@tests ($probe), $engine, $monitor; async_engine:
            async_requests_complete_exactly_once_at_qd32,
            dropped_futures_free_nothing_early_and_leak_nothing,
            block_on_inside_a_completion_callback,
            cancel_after_submit_completes_each_once,
        );
        $crate::engine_conformance!(@tests ($probe), $engine, $monitor; iothread:
            engine_runs_inside_an_iothread,
        );
        $crate::engine_conformance!(@tests ($probe), $engine, $monitor; engine:
            write_then_read_at_random_offsets,
            readv_and_writev,
            fsync_and_fdatasync,
            o_direct_with_aligned_buffers,
            short_read_at_eof_and_read_past_eof,
            errors_are_per_request_and_the_batch_completes,
            ten_thousand_requests_complete_exactly_once,
            cancel_of_a_queued_request_ends_with_ecanceled,
            plug_releases_a_full_batch,
            drain_hands_every_buffer_back,
            notifier_signals_every_completion_batch,
            qd1_through_the_loop_without_polling,
            drop_with_requests_in_flight_waits_for_them,
            bad_input_is_refused_with_the_request_handed_back,
            attached_engine_delivers_in_the_loop,
            nested_poll_in_a_completion_callback_loses_and_duplicates_nothing,
            callback_that_submits_and_waits_in_a_nested_loop_is_not_stuck_in_a_batch,
            injected_faults_are_reported_against_their_own_requests,
            context_dropped_with_thousands_in_flight,
        );
    };
    ($engine:expr, $monitor:expr) => {
        $crate::engine_conformance!(probe: ::std::result::Result::<(), &str>::Ok(()), $engine, $monitor);
    };
}

/// A file in the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Creates a file of `len` bytes (filled with `fill`) in the system temp dir.
    pub fn with_len(len: usize, fill: u8) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "aio-rs-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::create(&path).expect("create temp file");
        f.write_all(&vec![fill; len]).expect("fill temp file");
        f.sync_all().expect("sync temp file");
        TempFile { path }
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens read-write (with extra `flags`, e.g. `O_DIRECT`).
    pub fn open(&self, flags: i32) -> std::io::Result<IoFile> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(&self.path)
            .map(IoFile::from)
    }

    /// Opens read-only.
    pub fn open_read_only(&self) -> IoFile {
        IoFile::from(File::open(&self.path).expect("open read-only"))
    }

    /// The whole content.
    pub fn contents(&self) -> Vec<u8> {
        let mut v = Vec::new();
        File::open(&self.path)
            .and_then(|mut f| f.read_to_end(&mut v))
            .expect("read temp file");
        v
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A buffer of `len` pseudo-random bytes.
    pub fn buf(&mut self, len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new(len);
        for chunk in b.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        b
    }
}

/// Waits (at most 30 s) until `n` completions arrived, polling the engine and sleeping on its
/// notifier in between.
pub fn wait_for<E: IoEngine + ?Sized>(engine: &mut E, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = VecDeque::new();
    while out.len() < n {
        if engine.poll_completions(&mut out) == 0 {
            assert!(
                Instant::now() < deadline,
                "{}: only {} of {} completions after 30 s",
                engine.name(),
                out.len(),
                n
            );
            let mut pfd = libc::pollfd {
                fd: engine.notifier().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, 10) };
            engine.notifier().test_and_clear();
        }
    }
    out.into()
}

fn submit_all<E: IoEngine>(engine: &mut E, requests: Vec<Request>) -> Vec<Completion> {
    let n = requests.len();
    engine.plug();
    for r in requests {
        engine.submit(r).expect("submit");
    }
    engine.unplug();
    let mut done = wait_for(engine, n);
    done.sort_by_key(|c| c.token);
    done
}

fn ok(c: &Completion) -> usize {
    match &c.result {
        Ok(n) => *n,
        Err(e) => panic!("request {} failed: {e}", c.token),
    }
}

/// The block size of the engine tests.
pub const BLOCK: usize = 4096;

/// A read of block `block` (of [`BLOCK`] bytes) of `file` into a fresh buffer.
pub fn read_block(file: &IoFile, block: u64, token: u64) -> Request {
    Request::read(file, block * BLOCK as u64, AlignedBuf::new(BLOCK), token)
}

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
    let deadline = Instant::now() + Duration::from_secs(10);
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
}

/// Dropping an engine with hundreds of writes in flight waits for them: afterwards every
/// block holds either its new data in full or its old data, never anything else.
pub fn drop_with_requests_in_flight_waits_for_them<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let tmp = TempFile::with_len(256 * BLOCK, 0);
    for round in 0..5u8 {
        let mut engine = engine();
        let file = tmp.open(0).unwrap();
        for t in 0..256u64 {
            let fill = round.wrapping_mul(16).wrapping_add((t % 16) as u8) | 1;
            engine
                .submit(Request::write(
                    &file,
                    t * BLOCK as u64,
                    AlignedBuf::from_slice(&[fill; BLOCK]),
                    t,
                ))
                .unwrap();
        }
        drop(engine);
        let content = tmp.contents();
        // A drop that returned with writes still in the kernel would see them land later:
        // the file must not change once the drop has returned. (A correct engine passes
        // whatever the pause; the pause only gives a wrong one time to show.)
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            tmp.contents() == content,
            "round {round}: the file changed after the drop returned"
        );
        for t in 0..256usize {
            let block = &content[t * BLOCK..(t + 1) * BLOCK];
            // Cancelled writes leave an earlier round's data (or the initial zeros).
            let fill = |r: u8| r.wrapping_mul(16).wrapping_add((t % 16) as u8) | 1;
            let first = block[0];
            assert!(
                block.iter().all(|&b| b == first),
                "round {round}: block {t} is torn"
            );
            assert!(
                first == 0 || (0..=round).any(|r| fill(r) == first),
                "round {round}: block {t} holds {first:#x}, data no request wrote"
            );
        }
    }
}

/// Each completion makes the notifier readable (no polling of the engine in between) and
/// `has_completions` true, over many rounds: a batch flag that goes stale would hang here.
pub fn notifier_signals_every_completion_batch<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(16 * BLOCK, 1);
    let file = tmp.open(0).unwrap();
    let mut out = VecDeque::new();
    for round in 0..500u64 {
        engine.submit(read_block(&file, round % 16, round)).unwrap();
        let mut pfd = libc::pollfd {
            fd: engine.notifier().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert_eq!(r, 1, "round {round}: the notifier never became readable");
        engine.notifier().test_and_clear();
        // The notifier may fire a moment before the completion is visible: wait for it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !engine.has_completions() {
            assert!(
                Instant::now() < deadline,
                "round {round}: signalled, nothing waiting"
            );
            std::thread::yield_now();
        }
        out.clear();
        while out.is_empty() {
            engine.poll_completions(&mut out);
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token, round);
        assert!(!engine.has_completions());
    }
}

/// Thousands of sequential requests through an attached engine with polling off: every one
/// must be woken by the notifier alone.
pub fn qd1_through_the_loop_without_polling<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(16 * BLOCK, 1);
    let file = tmp.open(0).unwrap();
    let back: Rc<RefCell<Option<Completion>>> = Rc::default();
    let b = back.clone();
    let attached = ctx
        .attach_engine(engine(), move |_, c| *b.borrow_mut() = Some(c))
        .unwrap();
    let mut buf = Some(AlignedBuf::new(BLOCK));
    for i in 0..2000u64 {
        attached
            .submit(Request::read(
                &file,
                (i % 16) * BLOCK as u64,
                buf.take().unwrap(),
                i,
            ))
            .unwrap();
        super::poll_until(&ctx, "the next completion", || back.borrow().is_some());
        let c = back.borrow_mut().take().unwrap();
        assert_eq!(c.token, i);
        assert_eq!(ok(&c), BLOCK);
        buf = c.buf.into_one();
    }
    assert_eq!(ctx.counters().poll_hits, 0, "polling is off");
}

/// Refusals are typed and hand the request (and its buffer) back.
pub fn bad_input_is_refused_with_the_request_handed_back<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let e = engine
        .submit(Request::read(&file, 0, AlignedBuf::new(0), 1))
        .unwrap_err();
    assert!(matches!(e.error, RequestError::ZeroLength { .. }));
    assert_eq!(e.request.token, 1);
    let e = engine
        .submit(Request::write(
            &file,
            i64::MAX as u64 - 10,
            AlignedBuf::new(BLOCK),
            2,
        ))
        .unwrap_err();
    assert!(matches!(e.error, RequestError::OffsetOutOfRange { .. }));
    let back = e.request.op.into_buffers().into_one().unwrap();
    assert_eq!(back.len(), BLOCK, "the buffer comes back");
    let io: std::io::Error = RequestError::ZeroLength { op: "read" }.into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    // A duplicate outlives the caller's own fd and reads the same file.
    let dup = {
        let f = File::open(tmp.path()).unwrap();
        IoFile::dup(&f).unwrap()
    };
    assert_ne!(dup.raw_fd(), file.raw_fd());
    let done = submit_all(
        &mut engine,
        vec![Request::read(&dup, 0, AlignedBuf::new(BLOCK), 4)],
    );
    assert_eq!(ok(&done[0]), BLOCK);
    // Still working.
    let done = submit_all(
        &mut engine,
        vec![Request::read(&file, 0, AlignedBuf::new(BLOCK), 3)],
    );
    assert_eq!(ok(&done[0]), BLOCK);
    assert_eq!(engine.in_flight(), 0);
}

/// Attached to a context: completions arrive in the callback, in the loop.
pub fn attached_engine_delivers_in_the_loop<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 8);
    let file = tmp.open(0).unwrap();
    let got: Rc<RefCell<Vec<u64>>> = Rc::default();
    let g = got.clone();
    let attached = ctx
        .attach_engine(engine(), move |_ctx, c| {
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK));
            g.borrow_mut().push(c.token);
        })
        .unwrap();
    for t in 0..64u64 {
        attached.submit(read_block(&file, t, t)).unwrap();
    }
    super::poll_until(&ctx, "64 completions", || got.borrow().len() == 64);
    let mut tokens = got.borrow().clone();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..64).collect::<Vec<_>>());
    assert_eq!(attached.in_flight(), 0);
    assert_eq!(attached.delivered(), 64);
    // Detaching with another context is refused and hands the handle back.
    let other = AioContext::new(monitor()).unwrap();
    let (e, attached) = match attached.detach(&other) {
        Ok(_) => panic!("detach from another context succeeded"),
        Err(refused) => refused,
    };
    assert!(matches!(e, crate::AioError::NotRegistered { .. }), "{e}");
    drop(other);
    let Ok(engine) = attached.detach(&ctx) else {
        panic!("detach refused");
    };
    assert_eq!(engine.in_flight(), 0);
    assert_eq!(ctx.fd_handler_count(), 0);
}

/// A completion callback that runs a nested `poll()` until later requests complete: each
/// completion is delivered exactly once, none is lost, nothing deadlocks.
pub fn nested_poll_in_a_completion_callback_loses_and_duplicates_nothing<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 6);
    let file = tmp.open(0).unwrap();
    let delivered: Rc<RefCell<Vec<u64>>> = Rc::default();
    let nested_done = Rc::new(Cell::new(false));
    let first = Rc::new(Cell::new(true));
    let (d, n) = (delivered.clone(), nested_done.clone());
    let attached = ctx
        .attach_engine(engine(), move |ctx, c| {
            d.borrow_mut().push(c.token);
            if first.replace(false) {
                ctx.poll(false);
                // Wait inside the callback for every other request (QEMU's nested
                // aio_poll in a completion path).
                let dog = super::watchdog(ctx, Duration::from_secs(20));
                while d.borrow().len() < 16 {
                    assert!(!dog.get(), "nested loop never saw the other completions");
                    ctx.poll(true);
                }
                n.set(true);
            }
        })
        .unwrap();
    attached.plug();
    for t in 0..16u64 {
        attached.submit(read_block(&file, t, t)).unwrap();
    }
    attached.unplug();
    super::poll_until(&ctx, "all completions", || nested_done.get());
    while ctx.poll(false) {}
    let mut tokens = delivered.borrow().clone();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..16).collect::<Vec<_>>(), "each exactly once");
    assert!(ctx.counters().max_nesting >= 2);
    assert_eq!(attached.in_flight(), 0);
    assert!(
        attached.safety_net_runs() >= 1,
        "the nested loop was served by the safety-net bottom half"
    );
}

/// A completion callback submits a request and waits for it in a nested loop (the
/// submission is made while the driver batches the callbacks' submissions): the request must
/// still go out and complete.
pub fn callback_that_submits_and_waits_in_a_nested_loop_is_not_stuck_in_a_batch<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    use crate::engine::AttachedEngine;
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(8 * BLOCK, 3);
    let file = tmp.open(0).unwrap();
    let slot: Rc<RefCell<Option<AttachedEngine<L, E>>>> = Rc::default();
    let delivered: Rc<RefCell<Vec<u64>>> = Rc::default();
    let (s, d, f) = (slot.clone(), delivered.clone(), file.clone());
    let attached = ctx
        .attach_engine(engine(), move |ctx, c| {
            d.borrow_mut().push(c.token);
            if c.token < 4 {
                // Chain: each of the first four submits a follow-up and waits for it.
                let next = 100 + c.token;
                s.borrow()
                    .as_ref()
                    .unwrap()
                    .submit(Request::read(&f, 0, AlignedBuf::new(BLOCK), next))
                    .unwrap();
                let dog = super::watchdog(ctx, Duration::from_secs(20));
                while !d.borrow().contains(&next) {
                    assert!(!dog.get(), "the follow-up {next} never completed");
                    ctx.poll(true);
                }
            }
        })
        .unwrap();
    *slot.borrow_mut() = Some(attached);
    {
        let guard = slot.borrow();
        let engine = guard.as_ref().unwrap();
        engine.plug();
        for t in 0..4u64 {
            engine.submit(read_block(&file, t, t)).unwrap();
        }
        engine.unplug();
    }
    super::poll_until(&ctx, "eight completions", || delivered.borrow().len() == 8);
    let mut tokens = delivered.borrow().clone();
    tokens.sort_unstable();
    assert_eq!(tokens, [0, 1, 2, 3, 100, 101, 102, 103]);
    let attached = slot.borrow_mut().take().unwrap();
    assert_eq!(attached.in_flight(), 0);
}

/// Faults injected by [`FaultyEngine`](super::faults::FaultyEngine) (every 7th request fails
/// with EIO, token 3 with ENOSPC, completions held 200 µs and reordered) around the engine,
/// attached to a loop: every request completes exactly once, each injected error is reported
/// against its own request with its errno, and every other write is on disk.
pub fn injected_faults_are_reported_against_their_own_requests<
    E: IoEngine + 'static,
    L: EventLoop + 'static,
>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    use super::faults::{FaultPlan, FaultyEngine};
    const N: u64 = 512;
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(N as usize * BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let plan = FaultPlan {
        fail_every: Some((7, libc::EIO)),
        fail_tokens: vec![(3, libc::ENOSPC)],
        delay: Duration::from_micros(200),
        reorder: true,
        ..FaultPlan::default()
    };
    let faulty = FaultyEngine::new(engine(), plan).unwrap();
    let results: Rc<RefCell<Vec<Option<Option<i32>>>>> =
        Rc::new(RefCell::new(vec![None; N as usize]));
    let r = results.clone();
    let attached = ctx
        .attach_engine(faulty, move |_ctx, c| {
            let slot = &mut r.borrow_mut()[c.token as usize];
            assert!(slot.is_none(), "token {} completed twice", c.token);
            if let Ok(n) = &c.result {
                assert_eq!(*n, BLOCK, "token {}", c.token);
            }
            *slot = Some(c.errno());
        })
        .unwrap();
    // Submission n (from 1) carries token n - 1, so the 7th, 14th, ... fail: tokens 6, 13, ...
    for t in 0..N {
        let fill = (t % 251) as u8 + 1;
        attached
            .submit(Request::write(
                &file,
                t * BLOCK as u64,
                AlignedBuf::from_slice(&[fill; BLOCK]),
                t,
            ))
            .unwrap();
    }
    super::poll_until(&ctx, "every faulted and real completion", || {
        results.borrow().iter().all(Option::is_some)
    });
    let Ok(faulty) = attached.detach(&ctx) else {
        panic!("detach refused");
    };
    let stats = faulty.stats();
    let expected_failures = (0..N).filter(|t| t == &3 || (t + 1) % 7 == 0).count() as u64;
    assert_eq!(stats.failed, expected_failures);
    assert_eq!(stats.forwarded, N - expected_failures);
    assert!(stats.delayed >= N, "every completion was held");
    let content = tmp.contents();
    for (t, got) in results.borrow().iter().enumerate() {
        let t64 = t as u64;
        let want = if t64 == 3 {
            Some(libc::ENOSPC)
        } else if (t64 + 1) % 7 == 0 {
            Some(libc::EIO)
        } else {
            None
        };
        assert_eq!(*got, Some(want), "token {t}");
        let block = &content[t * BLOCK..(t + 1) * BLOCK];
        let fill = if want.is_some() {
            0
        } else {
            (t % 251) as u8 + 1
        };
        assert!(
            block.iter().all(|&b| b == fill),
            "token {t}: block holds {:#x}, expected {fill:#x}",
            block[0]
        );
    }
}

/// A context and its attached engine dropped with thousands of requests in flight, ten times:
/// nothing crashes, hangs or writes memory that was freed (run under a memory checker, see
/// `scripts/memcheck.sh`), and the file holds only data some request wrote.
pub fn context_dropped_with_thousands_in_flight<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    const N: u64 = 2048;
    let tmp = TempFile::with_len(256 * BLOCK, 0);
    for round in 0..10u8 {
        let ctx = AioContext::new(monitor()).unwrap();
        let file = tmp.open(0).unwrap();
        let attached = ctx.attach_engine(engine(), |_ctx, _c| {}).unwrap();
        attached.plug();
        for t in 0..N {
            let req = if t % 2 == 0 {
                Request::write(
                    &file,
                    (t % 256) * BLOCK as u64,
                    AlignedBuf::from_slice(&[round | 1; BLOCK]),
                    t,
                )
            } else {
                read_block(&file, t % 256, t)
            };
            attached.submit(req).unwrap();
        }
        attached.unplug();
        // One turn of the loop so some completions are in user space, then drop everything.
        ctx.poll(false);
        drop(attached);
        drop(ctx);
        let content = tmp.contents();
        for (i, block) in content.chunks(BLOCK).enumerate() {
            let first = block[0];
            assert!(
                block.iter().all(|&b| b == first),
                "round {round}: block {i} torn"
            );
            assert!(
                first == 0 || (first & 1 == 1 && first <= (round | 1)),
                "round {round}: block {i} holds {first:#x}"
            );
        }
    }
}
