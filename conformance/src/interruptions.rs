//! The engine interrupted: signals that land in its own waits and submissions, and a drop
//! with requests in flight, on a fast file and behind a write limit that holds them in the
//! block layer. Part of [`engine_conformance!`](crate::engine_conformance).
//!
//! This module owns those tests and the barrier that makes the drop tests' verdict exact (the
//! writes the kernel still runs on a file or a block device have landed before the file is read
//! again), never the suite's other tests (`engine`) or the write limit (`throttle`).

use std::collections::VecDeque;
use std::time::Duration;

use super::fixtures::{ok, read_block, TempFile, BLOCK};
use super::throttle::{read_direct, WriteLimit};
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request};
use aio_core::EventLoop;

/// Signals that interrupt the engine's own calls (`drain` blocking in `io_getevents` or
/// `io_uring_enter`, the submission calls) are retried, never reported: see
/// [`read_through_a_signal_storm`]. With `O_DIRECT` where the file system takes it, so that
/// the engine's waits block on the device and the signals find them blocked.
pub fn signals_during_io_are_retried_not_reported<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(64 * BLOCK, 7);
    let file = tmp.open_direct_or_say();
    read_through_a_signal_storm(&mut engine, &file);
}

/// 2,048 reads of `file`'s first 64 blocks (each filled with 7) in batches of 64, each batch
/// drained, while another thread sends this one SIGURG (a no-op handler without
/// `SA_RESTART`) every 20 µs; every read succeeds with its data. Returns the signals sent.
/// An engine's own count of interrupted calls says whether any found a call to interrupt.
pub fn read_through_a_signal_storm<E: IoEngine>(engine: &mut E, file: &IoFile) -> u64 {
    let storm = super::SignalStorm::start(Duration::from_micros(20));
    let mut done = 0;
    for round in 0..32u64 {
        for b in 0..64 {
            engine.submit(read_block(file, b, round * 64 + b)).unwrap();
        }
        for c in engine.drain() {
            assert_eq!(ok(&c), BLOCK, "token {}", c.token);
            assert!(c.buf.into_one().unwrap().iter().all(|&b| b == 7));
            done += 1;
        }
    }
    let sent = storm.sent();
    drop(storm);
    assert_eq!(done, 2048);
    assert!(sent > 0, "no signal was sent while the reads ran");
    sent
}

/// Returns once every write the kernel still runs on `tmp` has landed. A block device (the
/// loop-device suite): its in-flight count in sysfs (`/sys/class/block/NAME/inflight`) is 0.
/// A file: `fallocate` waits for the direct I/O in flight on it (`inode_dio_wait`, ext4 and
/// xfs) and for writes that hold the inode lock; where it cannot (`EOPNOTSUPP`), says so and
/// pauses 20 ms instead.
fn wait_for_writes_in_the_kernel(tmp: &TempFile) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let path = tmp.path();
    let meta = std::fs::metadata(path).expect("metadata");
    if meta.file_type().is_block_device() {
        let name = path.file_name().expect("a device name").to_string_lossy();
        let inflight = format!("/sys/class/block/{name}/inflight");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let counts = std::fs::read_to_string(&inflight).expect("the device's inflight");
            if counts.split_whitespace().all(|n| n == "0") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{inflight} still says {counts:?} after 30 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for fallocate");
    let len = meta.len() as libc::off_t;
    // SAFETY: a valid fd; KEEP_SIZE past the end changes no byte of the file.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, len, 4096) };
    if r != 0 {
        super::skip(&format!(
            "fallocate on {}: {}; a 20 ms pause stands in for the in-flight barrier",
            path.display(),
            std::io::Error::last_os_error()
        ));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Dropping an engine with hundreds of writes in flight waits for them: afterwards every
/// block holds either its new data in full or its old data, never anything else, every write
/// that completed before the drop is there, and nothing changes once the drop has returned.
/// With `O_DIRECT` where the file system takes it, so the writes really are in flight.
pub fn drop_with_requests_in_flight_waits_for_them<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let tmp = TempFile::with_len(256 * BLOCK, 0);
    for round in 0..5u8 {
        let mut engine = engine();
        let file = tmp.open_direct_or_say();
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
        // Those already complete must be on disk after the drop.
        let mut completed = VecDeque::new();
        engine.poll_completions(&mut completed);
        drop(engine);
        let content = tmp.contents();
        for c in &completed {
            let t = c.token as usize;
            let fill = round.wrapping_mul(16).wrapping_add((t % 16) as u8) | 1;
            if c.result.is_ok() {
                assert_eq!(
                    content[t * BLOCK],
                    fill,
                    "round {round}: block {t} completed before the drop, but is not on disk"
                );
            }
        }
        // A drop that returned with writes still in the kernel would see them land later:
        // the file must not change once the drop has returned.
        wait_for_writes_in_the_kernel(&tmp);
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

/// Dropping an engine while the block layer still holds its writes waits for them: a write
/// limit of 20 a second on the loop device (a cgroup of this thread, [`WriteLimit`]) holds
/// most of eight writes when the drop starts, and the device does not change once the drop has
/// returned. A drop that returned at once, its writes still held, would see them land after.
/// The engine is built under the limit, so that the threads it starts (the pool's) are too.
pub fn drop_waits_for_writes_the_block_layer_holds<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    const WRITES: u64 = 8;
    let tmp = TempFile::with_len(64 * BLOCK, 0);
    let file = tmp.open_direct_or_say();
    let Some(limit) = WriteLimit::on(tmp.path(), 20) else {
        return;
    };
    let mut engine = engine();
    for t in 0..WRITES {
        let data = AlignedBuf::from_slice(&[0xa5; BLOCK]);
        let write = Request::write(&file, t * BLOCK as u64, data, t);
        engine.submit(write).unwrap();
    }
    let mut done = VecDeque::new();
    engine.poll_completions(&mut done);
    assert!(
        done.len() < WRITES as usize / 2,
        "the limit held too few writes: {} of {WRITES} done before the drop",
        done.len()
    );
    drop(engine);
    let len = WRITES as usize * BLOCK;
    let at_drop = read_direct(tmp.path(), len);
    // Behind every write still held (the limit keeps their order), then the device drained.
    limit.write_behind_the_held_ones(tmp.path(), 63 * BLOCK as u64);
    wait_for_writes_in_the_kernel(&tmp);
    drop(limit);
    assert!(
        read_direct(tmp.path(), len) == at_drop,
        "the device changed after the drop returned"
    );
    for (t, block) in at_drop.chunks(BLOCK).enumerate() {
        assert!(
            block.iter().all(|&b| b == block[0]) && (block[0] == 0 || block[0] == 0xa5),
            "block {t} is torn or holds data no request wrote"
        );
    }
}
