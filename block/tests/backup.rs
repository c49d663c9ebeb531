//! Backups with copy-before-write (`aio_block::backup`, `aio_block::block_copy`), on raw and
//! qcow2 images:
//!
//! * a full backup's target equals the source at the start, though the source was written
//!   through a queue after it (copy-before-write: without it the target would hold the new
//!   data) and by a thread writing all through the job's run;
//! * holes of the source stay holes of a qcow2 target; `qemu-img compare` and `check` agree;
//! * `none` copies only the chunks writes changed; a bitmap backup only the bitmap's chunks;
//! * the bitmap after the end, per mode and outcome, as QEMU leaves it;
//! * QEMU's refusals (the same image, other sizes, a read-only target).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use aio_block::backup::{Backup, BitmapMode, JobControl, SyncMode};
use aio_block::bitmap::DirtyBitmap;
use aio_block::block_copy::BlockCopyError;
use aio_block::{Image, ImageOptions};
use common::bitmaps::dirty;
use common::session::Session;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const SIZE: u64 = 8 * MIB;

/// A job that is never paused; cancelled at once when `cancelled`.
#[derive(Default)]
struct Control {
    cancelled: AtomicBool,
    done: AtomicU64,
}

impl JobControl for Control {
    fn checkpoint(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
    fn progress(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }
    fn wait_for_cancel(&self) {}
}

/// The byte the source holds at `offset` at the start: data in every MiB but the odd ones'
/// second half (a hole).
fn original(offset: u64) -> u8 {
    (offset / (64 * KIB)) as u8 | 1
}

/// A raw source of [`SIZE`] bytes holding [`original`]'s data (holes where it has none), and
/// a sparse target of the same size, in `dir`.
fn images(dir: &Path) -> (PathBuf, PathBuf) {
    let source = dir.join("source.img");
    let mut bytes = vec![0u8; SIZE as usize];
    for (at, b) in bytes.iter_mut().enumerate() {
        *b = original(at as u64);
    }
    std::fs::write(&source, &bytes).unwrap();
    // Holes: the second half of every odd MiB.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap();
    for mib in (1..8).step_by(2) {
        punch(&file, mib * MIB + MIB / 2, MIB / 2);
    }
    let target = dir.join("target.img");
    std::fs::File::create(&target)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    (source, target)
}

fn punch(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open fd; no pointers.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

/// What the source held at the start.
fn expected() -> Vec<u8> {
    (0..SIZE)
        .map(|at| {
            let (mib, within) = (at / MIB, at % MIB);
            if mib % 2 == 1 && within >= MIB / 2 {
                0
            } else {
                original(at)
            }
        })
        .collect()
}

fn open(path: &Path) -> Arc<Image> {
    Arc::new(Image::open(path, ImageOptions::default()).unwrap())
}

fn read_all(image: &Image) -> Vec<u8> {
    let mut buf = aio_core::engine::AlignedBuf::new(SIZE as usize);
    image.read_at(0, &mut buf).unwrap();
    buf.to_vec()
}

/// Writes `byte` at each `(offset, len)` through a queue of `image` (the request filter's
/// path).
fn write_through(image: &Arc<Image>, byte: u8, writes: &[(u64, u64)]) {
    let (_, engine) = common::engines().into_iter().next().unwrap();
    let s = Session::new(image, engine);
    for &(offset, len) in writes {
        s.write(offset, &vec![byte; len as usize], false).unwrap();
    }
}

/// Writes that straddle chunks, hit a hole and the last chunk.
const WRITES: &[(u64, u64)] = &[
    (60 * KIB, 8 * KIB),
    (MIB + 3 * MIB / 4, 4 * KIB),
    (SIZE - 4 * KIB, 4 * KIB),
];

#[test]
fn a_full_backup_holds_the_source_as_it_was_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = images(dir.path());
    let (source, target) = (open(&source), open(&target));
    let backup = Backup::start(&source, target.clone(), SyncMode::Full, None).unwrap();
    assert_eq!(backup.total(), SIZE);
    // Written after the start, before the job copied anything: copied first.
    write_through(&source, 0xaa, WRITES);
    let control = Control::default();
    backup.run(&control).unwrap();
    assert_eq!(control.done.load(Ordering::Relaxed), SIZE);
    backup.finish(true);
    assert!(read_all(&target) == expected(), "the target is the start's");
    let now = read_all(&source);
    for &(offset, len) in WRITES {
        assert!(now[offset as usize..(offset + len) as usize]
            .iter()
            .all(|b| *b == 0xaa));
    }
    // Detached: a write now reaches the source only.
    write_through(&source, 0xbb, &[(0, 4 * KIB)]);
    assert_eq!(read_all(&target)[0], original(0));
}

#[test]
fn writes_all_through_the_run_never_reach_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = images(dir.path());
    let (source, target) = (open(&source), open(&target));
    let backup = Backup::start(&source, target.clone(), SyncMode::Full, None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (source, stop) = (source.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut at = 0;
            let mut rounds = 0;
            // At least one pass over the disk, and on until the job is done.
            while rounds < 2 * SIZE / (64 * KIB) || !stop.load(Ordering::Relaxed) {
                write_through(&source, 0xcc, &[(at, 4 * KIB)]);
                at = (at + 68 * KIB) % (SIZE - 4 * KIB);
                rounds += 1;
            }
        })
    };
    backup.run(&Control::default()).unwrap();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    backup.finish(true);
    assert!(read_all(&target) == expected());
}

#[test]
fn a_none_backup_copies_only_what_writes_change() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = images(dir.path());
    let (source, target) = (open(&source), open(&target));
    let backup = Backup::start(&source, target.clone(), SyncMode::None, None).unwrap();
    let chunk = backup.copy().chunk_size();
    write_through(&source, 0xaa, &[(2 * MIB + 512, 512)]);
    backup.run(&Control::default()).unwrap();
    assert_eq!(backup.copy().copied(), chunk);
    backup.finish(false);
    let got = read_all(&target);
    let want = expected();
    let copied = (2 * MIB) as usize..(2 * MIB + chunk) as usize;
    assert!(got[copied.clone()] == want[copied.clone()]);
    assert!(got[..copied.start].iter().all(|b| *b == 0));
    assert!(got[copied.end..].iter().all(|b| *b == 0));
}

/// A source with bitmap `b` (64 KiB granules) dirtied at `before`.
fn with_bitmap(dir: &Path, before: &[(u64, u64)]) -> (Arc<Image>, Arc<Image>, Arc<DirtyBitmap>) {
    let (source, target) = images(dir);
    let (source, target) = (open(&source), open(&target));
    let bitmap = Arc::new(DirtyBitmap::new("b", SIZE, 64 << 10).unwrap());
    source.insert_dirty_bitmap(bitmap.clone()).unwrap();
    write_through(&source, 0x11, before);
    (source, target, bitmap)
}

#[test]
fn a_bitmap_backup_copies_the_bitmaps_chunks_and_leaves_it_as_its_mode_says() {
    let before = [(MIB, 4 * KIB), (5 * MIB, 128 * KIB)];
    let during = [(3 * MIB, 4 * KIB)];
    let joined = |a: &[(u64, u64)], b: &[(u64, u64)]| {
        let mut all: Vec<(u64, u64)> = a
            .iter()
            .chain(b)
            .map(|&(o, l)| (o / (64 * KIB) * 64 * KIB, l.max(64 * KIB)))
            .collect();
        all.sort();
        all
    };
    for (mode, succeeded, left) in [
        (BitmapMode::OnSuccess, true, joined(&[], &during)),
        (BitmapMode::OnSuccess, false, joined(&before, &during)),
        (BitmapMode::Never, true, joined(&before, &during)),
        (BitmapMode::Always, true, joined(&[], &during)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (source, target, bitmap) = with_bitmap(dir.path(), &before);
        let start = read_all(&source);
        let backup = Backup::start(
            &source,
            target.clone(),
            SyncMode::Bitmap,
            Some((bitmap.clone(), mode)),
        )
        .unwrap();
        assert_eq!(backup.total(), 3 * 64 * KIB, "the bitmap's chunks");
        assert!(bitmap.is_busy());
        write_through(&source, 0x22, &during);
        if succeeded {
            backup.run(&Control::default()).unwrap();
        }
        backup.finish(succeeded);
        assert!(!bitmap.is_busy());
        assert_eq!(dirty(&bitmap), left, "{mode:?} succeeded={succeeded}");
        if !succeeded {
            continue;
        }
        let got = read_all(&target);
        for (offset, len) in [(MIB, 64 * KIB), (5 * MIB, 128 * KIB)] {
            let r = offset as usize..(offset + len) as usize;
            assert!(got[r.clone()] == start[r], "the bitmap's chunk at {offset}");
        }
        let elsewhere = (2 * MIB) as usize..(5 * MIB) as usize;
        assert!(
            got[elsewhere].iter().all(|b| *b == 0),
            "nothing else copied"
        );
    }
}

#[test]
fn always_keeps_what_a_failed_backup_did_not_copy() {
    let dir = tempfile::tempdir().unwrap();
    let before = [(MIB, 4 * KIB), (5 * MIB, 4 * KIB)];
    let (source, target, bitmap) = with_bitmap(dir.path(), &before);
    let backup = Backup::start(
        &source,
        target,
        SyncMode::Bitmap,
        Some((bitmap.clone(), BitmapMode::Always)),
    )
    .unwrap();
    // A write copies the first chunk; the backup then fails without copying the other.
    write_through(&source, 0x22, &[(MIB, 4 * KIB)]);
    backup.finish(false);
    assert_eq!(dirty(&bitmap), [(MIB, 64 * KIB), (5 * MIB, 64 * KIB)]);
}

#[test]
fn qemus_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = images(dir.path());
    let source = open(&source);
    let err = |r: Result<Backup, aio_block::backup::BackupError>| r.unwrap_err().to_string();
    assert_eq!(
        err(Backup::start(&source, source.clone(), SyncMode::Full, None)),
        BlockCopyError::SameImage.to_string()
    );
    assert_eq!(
        BlockCopyError::SameImage.to_string(),
        "Source and target cannot be the same"
    );
    let small = dir.path().join("small.img");
    std::fs::File::create(&small).unwrap().set_len(MIB).unwrap();
    assert_eq!(
        err(Backup::start(&source, open(&small), SyncMode::Full, None)),
        "Source and target image have different sizes"
    );
    let read_only =
        Arc::new(Image::open(&target, ImageOptions::default().read_only(true)).unwrap());
    assert_eq!(
        err(Backup::start(&source, read_only, SyncMode::Full, None)),
        "Block node is read-only"
    );
}

#[cfg(feature = "qcow2")]
#[test]
fn a_qcow2_target_keeps_the_sources_holes_and_equals_it_for_qemu_img() {
    use aio_test_support::tool::run_in;
    if !common::bitmaps::have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_in(
        d,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "s.qcow2", "64M"],
    );
    run_in(
        d,
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "t.qcow2", "64M"],
    );
    run_in(
        d,
        "qemu-io",
        &[
            "-c",
            "write -P 3 0 1M",
            "-c",
            "write -P 4 40M 192k",
            "s.qcow2",
        ],
    );
    std::fs::copy(d.join("s.qcow2"), d.join("start.qcow2")).unwrap();
    let (source, target) = (open(&d.join("s.qcow2")), open(&d.join("t.qcow2")));
    let backup = Backup::start(&source, target.clone(), SyncMode::Full, None).unwrap();
    write_through(
        &source,
        0x55,
        &[(40 * MIB + 64 * KIB, 4 * KIB), (20 * MIB, 4 * KIB)],
    );
    backup.run(&Control::default()).unwrap();
    backup.finish(true);
    let data: u64 = target
        .block_status(0, 64 * MIB)
        .unwrap()
        .iter()
        .filter(|e| e.kind == aio_block::status::ExtentKind::Data)
        .map(|e| e.len)
        .sum();
    assert_eq!(data, MIB + 192 * KIB, "only the source's data is data");
    drop(backup);
    source.close().unwrap();
    target.close().unwrap();
    drop((source, target));
    run_in(d, "qemu-img", &["compare", "-q", "start.qcow2", "t.qcow2"]);
    run_in(d, "qemu-img", &["check", "-q", "t.qcow2"]);
}

/// A qcow2 scratch image in `dir` over `source` as its backing node (QEMU's `backing=NODE`).
#[cfg(feature = "qcow2")]
fn scratch_over(dir: &Path, source: &Arc<Image>) -> Arc<Image> {
    aio_test_support::tool::run_in(
        dir,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "scratch.qcow2",
            &SIZE.to_string(),
        ],
    );
    let options = ImageOptions::default().open_backing(false);
    let scratch = Arc::new(Image::open(&dir.join("scratch.qcow2"), options).unwrap());
    scratch.set_backing_node(Some(source.clone())).unwrap();
    scratch
}

#[cfg(feature = "qcow2")]
#[test]
fn a_scratch_image_over_its_backing_node_serves_the_source_as_it_was() {
    use aio_block::image::BackingNodeError;
    use aio_block::status::ExtentKind;
    if !common::bitmaps::have(&["qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = images(dir.path());
    let source = open(&source);
    let scratch = scratch_over(dir.path(), &source);
    let (_, engine) = common::engines().into_iter().next().unwrap();
    let s = Session::new(&scratch, engine);
    let read = |offset: u64, len: usize| {
        let (result, data) = s.read(offset, len);
        result.unwrap();
        data
    };
    // Read through: the source's bytes, and its holes in block status.
    assert!(read(0, SIZE as usize) == expected());
    let data = |image: &Image| -> Vec<(u64, u64)> {
        (image.block_status(0, SIZE).unwrap().iter())
            .filter(|e| e.kind == ExtentKind::Data)
            .map(|e| (e.offset, e.len))
            .collect()
    };
    assert_eq!(data(&scratch), data(&source));
    // Nothing written through a queue; no loop; a kind without a backing.
    assert_eq!(
        common::session::errno(s.write(0, &[1; 4096], false)),
        Some(libc::EPERM)
    );
    assert_eq!(
        scratch.set_backing_node(Some(scratch.clone())),
        Err(BackingNodeError::Loop)
    );
    assert_eq!(
        source.set_backing_node(None),
        Err(BackingNodeError::NoBacking("raw"))
    );

    // Fleecing: the source written after the backup's start; the scratch still reads it as
    // it was, the copied chunk from itself, the rest through the source.
    let backup = Backup::start(&source, scratch.clone(), SyncMode::None, None).unwrap();
    write_through(&source, 0xaa, WRITES);
    assert!(read(0, SIZE as usize) == expected());
    assert!(read_all(&source)[60 << 10] == 0xaa);
    backup.run(&Control::default()).unwrap();
    backup.finish(false);
}

#[cfg(feature = "qcow2")]
#[test]
fn a_qcow2_image_opened_with_its_backing_file_takes_no_backing_node() {
    if !common::bitmaps::have(&["qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = images(dir.path());
    let source = open(&source);
    aio_test_support::tool::run_in(
        dir.path(),
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "top.qcow2", "8M"],
    );
    let top = open(&dir.path().join("top.qcow2"));
    assert_eq!(
        top.set_backing_node(Some(source)),
        Err(aio_block::image::BackingNodeError::BackingFileOpened)
    );
}
