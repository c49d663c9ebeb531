//! The engine suite's fixtures: temporary files (or loop devices over them), a seeded
//! generator of test data, and a completion waiter.
//!
//! This module owns the fixtures, never a test: the tests live in `engine`, `engine_loop`,
//! `disk`, `async_engine` and `iothread`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aio_core::engine::{AlignedBuf, Completion, IoEngine, IoFile, Request};

/// A file in the system temp dir, removed on drop; or, created while
/// [`on_loop_devices`] holds, a loop device over such a file, detached on drop.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    device: Option<PathBuf>,
}

impl TempFile {
    /// Creates a file of `len` bytes (filled with `fill`) in the system temp dir. While this
    /// thread holds an [`on_loop_devices`] guard, the file is the backing of a new loop device
    /// and [`path`](Self::path) names the device (`len` must then be a multiple of 512).
    pub fn with_len(len: usize, fill: u8) -> TempFile {
        if ON_LOOP_DEVICES.with(Cell::get) {
            return TempFile::on_a_loop_device(len, fill)
                .unwrap_or_else(|e| panic!("loop devices worked a moment ago: {e}"));
        }
        Self::file(len, fill)
    }

    fn file(len: usize, fill: u8) -> TempFile {
        super::leftovers::sweep();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "aio-rs-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::create(&path).expect("create temp file");
        f.write_all(&vec![fill; len]).expect("fill temp file");
        f.sync_all().expect("sync temp file");
        TempFile { path, device: None }
    }

    /// A loop device (`losetup --find --show --direct-io=on`) over a new file of `len` bytes
    /// filled with `fill`; `Err` says why there is none (not root, no `losetup`, no free
    /// device). The device is detached and the file removed on drop, a failed test included.
    pub fn on_a_loop_device(len: usize, fill: u8) -> Result<TempFile, String> {
        Self::on_a_loop_device_with_sectors(len, fill, 512)
    }

    /// [`TempFile::on_a_loop_device`] with logical sectors of `sector` bytes (`losetup
    /// --sector-size`): the device's direct-I/O alignment.
    pub fn on_a_loop_device_with_sectors(
        len: usize,
        fill: u8,
        sector: usize,
    ) -> Result<TempFile, String> {
        assert_eq!(
            len % sector,
            0,
            "a loop device's size is a multiple of its sector"
        );
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("loop devices need root".into());
        }
        let mut tmp = Self::file(len, fill);
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on", "--sector-size"])
            .arg(sector.to_string())
            .arg(&tmp.path)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        tmp.device = Some(device.clone());
        // What the suite promises to run on: a block device doing direct I/O to its file.
        let name = device
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"));
        let is_block = std::fs::metadata(&device)
            .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
            .unwrap_or(false);
        if !is_block || !dio.as_deref().is_ok_and(|d| d.trim() == "1") {
            return Err(format!(
                "{} is not a block device with direct I/O (dio: {dio:?})",
                device.display()
            ));
        }
        LOOP_DEVICES_MADE.with(|n| n.set(n.get() + 1));
        Ok(tmp)
    }

    /// The path to open: the file, or the loop device over it.
    pub fn path(&self) -> &Path {
        self.device.as_deref().unwrap_or(&self.path)
    }

    /// The file in the temp dir (the loop device's backing, where there is one).
    pub fn backing(&self) -> &Path {
        &self.path
    }

    /// Opens read-write (with extra `flags`, e.g. `O_DIRECT`).
    pub fn open(&self, flags: i32) -> std::io::Result<IoFile> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(self.path())
            .map(IoFile::from)
    }

    /// Opens read-write with `O_DIRECT` where the file system takes it; where it does not,
    /// says `skipped:` why (a failure under `AIO_REQUIRE_ALL_BACKENDS=1`) and opens it
    /// buffered, so the test still runs its other checks.
    pub fn open_direct_or_say(&self) -> IoFile {
        match self.open(libc::O_DIRECT) {
            Ok(file) => file,
            Err(e) => {
                super::skip(&format!(
                    "O_DIRECT on {}: {e}; running buffered instead",
                    self.path().display()
                ));
                self.open(0).expect("open buffered")
            }
        }
    }

    /// Opens read-only.
    pub fn open_read_only(&self) -> IoFile {
        IoFile::from(File::open(self.path()).expect("open read-only"))
    }

    /// The whole content (through the device, where there is one).
    pub fn contents(&self) -> Vec<u8> {
        let mut v = Vec::new();
        File::open(self.path())
            .and_then(|mut f| f.read_to_end(&mut v))
            .expect("read temp file");
        v
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(device) = &self.device {
            let _ = Command::new("losetup").arg("-d").arg(device).status();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

thread_local! {
    static ON_LOOP_DEVICES: Cell<bool> = const { Cell::new(false) };
    /// Loop devices this thread set up and checked (a block device, `loop/dio` 1).
    static LOOP_DEVICES_MADE: Cell<u64> = const { Cell::new(0) };
}

/// While alive, every [`TempFile::with_len`] on this thread is a loop device: the guard that
/// runs the engine suite once more against a real block device.
#[derive(Debug)]
pub struct OnLoopDevices {
    made_before: u64,
    // A thread's setting: the guard stays on the thread that set it.
    _not_send: PhantomData<*const ()>,
}

impl OnLoopDevices {
    /// Loop devices this thread has set up and checked since the guard was made: a test run
    /// "on a loop device" that made none ran on plain files.
    pub fn devices_made(&self) -> u64 {
        LOOP_DEVICES_MADE.with(Cell::get) - self.made_before
    }
}

impl Drop for OnLoopDevices {
    fn drop(&mut self) {
        ON_LOOP_DEVICES.with(|on| on.set(false));
    }
}

/// Makes this thread's [`TempFile`]s loop devices until the guard drops, or reports
/// `skipped:` with the reason (not root, no `losetup`, no free device) and returns `None`. The
/// first call sets up and detaches one device to find out; later calls reuse the answer.
pub fn on_loop_devices(what: &str) -> Option<OnLoopDevices> {
    static WORKS: OnceLock<Result<(), String>> = OnceLock::new();
    let works = WORKS.get_or_init(|| TempFile::on_a_loop_device(512, 0).map(drop));
    let () = super::available(&format!("{what} on a loop device"), works.clone())?;
    ON_LOOP_DEVICES.with(|on| on.set(true));
    Some(OnLoopDevices {
        made_before: LOOP_DEVICES_MADE.with(Cell::get),
        _not_send: PhantomData,
    })
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
            wait_readable(engine.notifier().as_raw_fd(), Duration::from_millis(10));
            engine.notifier().test_and_clear();
        }
    }
    out.into()
}

/// Waits up to `timeout` for `fd` to be readable (one `poll(2)`); whether it became so.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one pollfd, valid for the duration of the call; a closed fd is reported in
    // `revents` (`POLLNVAL`), which is then not `POLLIN`.
    let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
    ready == 1 && pfd.revents & libc::POLLIN != 0
}

pub(crate) fn submit_all<E: IoEngine>(engine: &mut E, requests: Vec<Request>) -> Vec<Completion> {
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

pub(crate) fn ok(c: &Completion) -> usize {
    match &c.result {
        Ok(n) => *n,
        Err(e) => panic!("request {} failed: {e}", c.token),
    }
}

/// The block size of the engine tests.
pub const BLOCK: usize = 4096;

/// Reads and writes of `file`'s first blocks, with and without [`RwFlags`](aio_core::engine::RwFlags),
/// each with the `RWF_*` bits an engine must hand the kernel for it (`aio_rw_flags`, an SQE's
/// `rw_flags`): tokens 1 to 4 move one buffer (a FUA write, a NOWAIT read, a plain write, a
/// plain read), 5 and 6 two (a NOWAIT readv, a FUA writev).
pub fn requests_with_rw_flags(file: &IoFile) -> Vec<(Request, libc::c_int)> {
    use aio_core::engine::RwFlags;
    let buf = || AlignedBuf::new(BLOCK);
    vec![
        (
            Request::write(file, 0, buf(), 1).with_flags(RwFlags::FUA),
            libc::RWF_DSYNC,
        ),
        (
            Request::read(file, 0, buf(), 2).with_flags(RwFlags::NOWAIT),
            libc::RWF_NOWAIT,
        ),
        (Request::write(file, 0, buf(), 3), 0),
        (Request::read(file, 0, buf(), 4), 0),
        (
            Request::readv(file, 0, vec![buf(), buf()], 5).with_flags(RwFlags::NOWAIT),
            libc::RWF_NOWAIT,
        ),
        (
            Request::writev(file, 0, vec![buf(), buf()], 6).with_flags(RwFlags::FUA),
            libc::RWF_DSYNC,
        ),
    ]
}

/// A read of block `block` (of [`BLOCK`] bytes) of `file` into a fresh buffer.
pub fn read_block(file: &IoFile, block: u64, token: u64) -> Request {
    Request::read(file, block * BLOCK as u64, AlignedBuf::new(BLOCK), token)
}
