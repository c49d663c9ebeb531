//! The virtual-disk part of the engine conformance suite: discard and write-zeroes, FUA and
//! NOWAIT, per-request completion callbacks and a full file system (a real block device's are
//! in `block_device`, requests over lent memory in `lent`).
//!
//! This module owns those tests and their fixtures (a ramfs mount, a full 1 MiB tmpfs). [`engine_conformance!`](crate::engine_conformance) runs them with the rest.
//!
//! An engine may refuse a discard or write-zeroes at `submit` with a typed
//! [`RequestError::Unsupported`] (Linux AIO has no `fallocate`; io_uring runs no ioctl): the
//! tests then check that the refusal hands the request back and stop there for that engine,
//! and the engine crate runs the suite once more behind [`WithFallback`](aio_core::engine::WithFallback) to
//! cover the real path.

use std::cell::{Cell, RefCell};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;

use super::fixtures::{wait_for, TempFile, BLOCK};
use aio_core::engine::{AlignedBuf, Completion, IoEngine, IoFile, Request, RequestError, RwFlags};
use aio_core::EventLoop;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;

/// Submits `request`; `None` when the engine refuses it as unsupported (checked: the request
/// comes back untouched), else its completion.
pub(crate) fn run_range_op<E: IoEngine>(engine: &mut E, request: Request) -> Option<Completion> {
    let (token, name) = (request.token, request.op.name());
    match engine.submit(request) {
        Ok(()) => Some(wait_for(engine, 1).remove(0)),
        Err(e) => {
            assert!(
                matches!(e.error, RequestError::Unsupported { .. }),
                "{}: {name} refused with {}",
                engine.name(),
                e.error
            );
            assert_eq!(e.request.token, token, "the request comes back");
            assert_eq!(e.request.op.name(), name);
            println!(
                "{}: {name} refused as unsupported (the WithFallback suite runs it)",
                engine.name()
            );
            None
        }
    }
}

pub(crate) fn blocks_of(path: &Path) -> u64 {
    std::fs::metadata(path).expect("stat").blocks()
}

/// Whether `path` is on tmpfs (which has no `ZERO_RANGE`).
fn on_tmpfs(path: &Path) -> bool {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs")
}

/// Discard and write-zeroes, with and without unmap: the ranges read back as zeroes, the
/// file keeps its size, the blocks are freed where the op frees them, the rest is untouched.
pub fn discard_and_write_zeroes_read_back_as_zeroes<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    const MIB: u64 = 1 << 20;
    let tmp = TempFile::with_len(4 * MIB as usize, 0x77);
    let file = tmp.open(0).unwrap();
    let size = std::fs::metadata(tmp.path()).unwrap().len();
    let full = blocks_of(tmp.path());
    let Some(done) = run_range_op(&mut engine, Request::discard(&file, 0, MIB, 1)) else {
        return;
    };
    assert_eq!(done.result.as_ref().ok(), Some(&(MIB as usize)), "{done:?}");
    let after_discard = blocks_of(tmp.path());
    assert!(
        after_discard < full,
        "discard frees blocks: {after_discard} of {full}"
    );
    let zeroes = Request::write_zeroes(&file, MIB, MIB, true, 2);
    let done = run_range_op(&mut engine, zeroes).expect("write-zeroes goes where discard went");
    assert_eq!(done.result.as_ref().ok(), Some(&(MIB as usize)), "{done:?}");
    let after_unmap = blocks_of(tmp.path());
    assert!(
        after_unmap < after_discard,
        "write-zeroes with unmap frees blocks"
    );
    let zeroes = Request::write_zeroes(&file, 2 * MIB, MIB / 2, false, 3);
    let done = run_range_op(&mut engine, zeroes).expect("write-zeroes goes where discard went");
    match &done.result {
        Ok(n) => assert_eq!(*n, MIB as usize / 2),
        // tmpfs has PUNCH_HOLE but not ZERO_RANGE: a typed refusal, never a silent write.
        Err(e) if on_tmpfs(tmp.path()) => {
            assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}")
        }
        Err(e) => panic!("write-zeroes without unmap failed: {e}"),
    }
    assert_eq!(
        std::fs::metadata(tmp.path()).unwrap().len(),
        size,
        "size kept"
    );
    let data = tmp.contents();
    let zeroed = if done.result.is_ok() { 5 } else { 4 } * (MIB as usize / 2);
    assert!(data[..zeroed].iter().all(|&b| b == 0), "zeroes read back");
    assert!(data[5 * (MIB as usize / 2)..].iter().all(|&b| b == 0x77));
    assert_eq!(engine.in_flight(), 0);
}

/// A small file system mounted for one test (ramfs: no `fallocate`; a size-limited tmpfs: a
/// full disk), unmounted and removed on drop.
struct Mount {
    dir: PathBuf,
}

impl Mount {
    fn new(fstype: &str, options: &str) -> Result<Mount, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(format!("mounting {fstype} needs root"));
        }
        super::leftovers::sweep();
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "aio-rs-{fstype}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let status = Command::new("mount")
            .args(["-t", fstype, "-o", options, "aio-rs-test"])
            .arg(&dir)
            .status()
            .map_err(|e| format!("mount: {e}"))?;
        if !status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("mount -t {fstype} failed: {status}"));
        }
        Ok(Mount { dir })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes that run out of space (a 1 MiB tmpfs, 2 MiB written at QD 32) complete with
/// `ENOSPC` in their own completions while the others succeed; nothing hangs, every request
/// completes once, and the engine goes on.
pub fn writes_on_a_full_file_system_fail_alone<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mount = match Mount::new("tmpfs", "size=1m") {
        Ok(m) => m,
        Err(reason) => return super::skip(&format!("no small file system: {reason}")),
    };
    let mut engine = engine();
    let path = mount.dir.join("disk");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let file = IoFile::from(f);
    const WRITES: u64 = 64;
    // 24 KiB does not divide the 1 MiB: one write fits only in part (a short write, whose
    // remainder then fails with ENOSPC).
    const SIZE: usize = 24 << 10;
    engine.plug();
    for i in 0..WRITES {
        let buf = AlignedBuf::from_slice(&[i as u8; SIZE]);
        engine
            .submit(Request::write(&file, i * SIZE as u64, buf, i))
            .unwrap();
    }
    engine.unplug();
    let mut done = wait_for(&mut engine, WRITES as usize);
    done.sort_by_key(|c| c.token);
    let (mut ok, mut full) = (0, 0);
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.token, i as u64, "each once");
        match &c.result {
            Ok(n) => {
                assert_eq!(*n, SIZE);
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "write {i}: {e}");
                full += 1;
            }
        }
    }
    assert!(ok > 0 && full > 0, "{ok} written, {full} out of space");
    assert_eq!(engine.in_flight(), 0);
    // The engine goes on: a read of what was written.
    let first = done.iter().position(|c| c.result.is_ok()).unwrap() as u64;
    engine
        .submit(Request::read(
            &file,
            first * SIZE as u64,
            AlignedBuf::new(SIZE),
            99,
        ))
        .unwrap();
    let back = wait_for(&mut engine, 1);
    assert_eq!(back[0].result.as_ref().ok(), Some(&SIZE));
    assert!(back[0]
        .buf
        .first()
        .unwrap()
        .iter()
        .all(|&b| b == first as u8));
}

/// A discard on a file system that cannot punch holes (ramfs) completes with a typed error
/// (kind `Unsupported`) in its own completion, and the next request on the engine works.
pub fn discard_refused_by_the_file_system_is_a_typed_error<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let ramfs = match Mount::new("ramfs", "mode=0700") {
        Ok(r) => r,
        Err(reason) => return super::skip(&format!("no file system without fallocate: {reason}")),
    };
    let mut engine = engine();
    let path = ramfs.dir.join("disk");
    std::fs::write(&path, vec![3u8; 4 * BLOCK]).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let file = IoFile::from(f);
    let Some(done) = run_range_op(&mut engine, Request::discard(&file, 0, BLOCK as u64, 7)) else {
        return;
    };
    assert_eq!(done.token, 7);
    let err = done.result.expect_err("ramfs has no punch hole");
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
    engine
        .submit(Request::read(&file, 0, AlignedBuf::new(BLOCK), 8))
        .unwrap();
    let done = wait_for(&mut engine, 1);
    assert_eq!(done[0].result.as_ref().ok(), Some(&BLOCK));
    assert!(done[0].buf.first().unwrap().iter().all(|&b| b == 3));
}

/// FUA writes complete and their data is there; NOWAIT reads complete, or fail with
/// `EAGAIN` / `EOPNOTSUPP` where the file cannot honour them, never hang or get retried.
pub fn fua_and_nowait_requests_complete<E: IoEngine, L: EventLoop>(
    engine: impl Fn() -> E,
    _monitor: impl Fn() -> L,
) {
    let mut engine = engine();
    let tmp = TempFile::with_len(8 * BLOCK, 0);
    let file = tmp.open_direct_or_say();
    for i in 0..8u64 {
        let w = Request::write(
            &file,
            i * BLOCK as u64,
            AlignedBuf::from_slice(&[i as u8 + 1; BLOCK]),
            i,
        );
        engine
            .submit(w.with_flags(RwFlags::FUA))
            .expect("FUA write");
    }
    for c in wait_for(&mut engine, 8) {
        assert_eq!(c.result.as_ref().ok(), Some(&BLOCK), "{c:?}");
    }
    let data = tmp.contents();
    for i in 0..8 {
        assert!(data[i * BLOCK..(i + 1) * BLOCK]
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
    let r = Request::read(&file, 0, AlignedBuf::new(BLOCK), 9).with_flags(RwFlags::NOWAIT);
    engine.submit(r).expect("NOWAIT read");
    let done = wait_for(&mut engine, 1);
    match &done[0].result {
        Ok(n) => {
            assert_eq!(*n, BLOCK);
            assert!(done[0].buf.first().unwrap().iter().all(|&b| b == 1));
        }
        Err(e) => assert!(
            matches!(
                e.raw_os_error(),
                Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP)
            ),
            "NOWAIT read: {e}"
        ),
    }
    let fua_read = Request::read(&file, 0, AlignedBuf::new(BLOCK), 10).with_flags(RwFlags::FUA);
    let e = engine.submit(fua_read).expect_err("FUA is for writes");
    assert!(matches!(e.error, RequestError::FlagsNotForOp { .. }));
}

/// Per-request callbacks: each runs once with the caller's token, submits the next request
/// from inside itself, and one of them waits in a nested `poll()` for another request's
/// callback; requests without their own callback still reach the engine-wide one.
pub fn per_request_callbacks_submit_from_inside<E: IoEngine + 'static, L: EventLoop + 'static>(
    engine: impl Fn() -> E,
    monitor: impl Fn() -> L,
) {
    let ctx = AioContext::new(monitor()).unwrap();
    let tmp = TempFile::with_len(64 * BLOCK, 0);
    let file = tmp.open(0).unwrap();
    let engine_wide = Rc::new(Cell::new(0u32));
    let ew = engine_wide.clone();
    let attached = ctx
        .attach_engine(engine(), move |_, c| {
            assert_eq!(c.token, 999, "only the plain request comes here");
            ew.set(ew.get() + 1);
        })
        .unwrap();
    // A chain of 64 writes, each submitted by the previous one's callback.
    let seen = Rc::new(RefCell::new(Vec::new()));
    write_chain(&attached, file.clone(), 0, seen.clone());
    // A plain request, with a token that would clash if the driver did not keep them apart.
    attached
        .submit(Request::read(&file, 0, AlignedBuf::new(BLOCK), 999))
        .unwrap();
    let reserved = Request::read(
        &file,
        0,
        AlignedBuf::new(BLOCK),
        aio_loop::PER_REQUEST_TOKEN_BIT,
    );
    let e = attached.submit(reserved).expect_err("reserved bit");
    assert!(matches!(e.error, RequestError::ReservedToken { .. }));
    // One callback waits, in a nested loop, for another request's callback.
    let (inner_done, outer_done) = submit_one_that_waits_nested(&attached, &file);
    super::poll_until(&ctx, "the chain and the nested wait", || {
        seen.borrow().len() == 64 && outer_done.get() && engine_wide.get() == 1
    });
    assert_eq!(
        *seen.borrow(),
        (0..64).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert!(inner_done.get());
    assert_eq!(attached.in_flight(), 0);
    let data = tmp.contents();
    for b in 0..64 {
        assert!(data[b * BLOCK..(b + 1) * BLOCK]
            .iter()
            .all(|&x| x == b as u8 + 1));
    }
    drop(attached.detach(&ctx).map_err(|(e, _)| e).unwrap());
}

/// Submits the write of `block` (filled with `block + 1`) whose callback records it in `seen`
/// and submits the next block's, up to block 63.
fn write_chain<L: EventLoop + 'static, E: IoEngine + 'static>(
    engine: &AttachedEngine<L, E>,
    file: IoFile,
    block: u64,
    seen: Rc<RefCell<Vec<u64>>>,
) {
    let buf = AlignedBuf::from_slice(&[block as u8 + 1; BLOCK]);
    let request = Request::write(&file, block * BLOCK as u64, buf, block);
    let f = file.clone();
    engine
        .submit_with(request, move |_, engine, c| {
            assert_eq!(c.token, block, "the caller's token comes back");
            assert_eq!(c.result.as_ref().ok(), Some(&BLOCK));
            seen.borrow_mut().push(block);
            if block + 1 < 64 {
                write_chain(engine, f, block + 1, seen);
            }
        })
        .expect("submit_with");
}

/// Submits a read whose callback submits another read and waits for its callback in a nested
/// `poll()`; returns the flags the inner and the outer callback set when they are done.
fn submit_one_that_waits_nested<L: EventLoop + 'static, E: IoEngine + 'static>(
    attached: &AttachedEngine<L, E>,
    file: &IoFile,
) -> (Rc<Cell<bool>>, Rc<Cell<bool>>) {
    let inner_done = Rc::new(Cell::new(false));
    let outer_done = Rc::new(Cell::new(false));
    let (inner, outer) = (inner_done.clone(), outer_done.clone());
    let f = file.clone();
    attached
        .submit_with(
            Request::read(file, 0, AlignedBuf::new(BLOCK), 5000),
            move |ctx, engine, c| {
                assert!(c.result.is_ok());
                let i = inner.clone();
                engine
                    .submit_with(
                        Request::read(&f, BLOCK as u64, AlignedBuf::new(BLOCK), 5001),
                        move |_, _, c| {
                            assert_eq!(c.token, 5001);
                            i.set(true);
                        },
                    )
                    .unwrap();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while !inner.get() {
                    assert!(std::time::Instant::now() < deadline, "nested wait stuck");
                    ctx.poll(true);
                }
                outer.set(true);
            },
        )
        .unwrap();
    (inner_done, outer_done)
}
