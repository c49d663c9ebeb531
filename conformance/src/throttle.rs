//! A write limit on one block device for the calling thread, through cgroup v1's `blkio`
//! controller (`blkio.throttle.write_iops_device`): the block layer then holds that thread's
//! writes to the device, and those of the threads it starts while the limit stands, so that a
//! test can act while they are in flight.
//!
//! This module owns the cgroup it makes (one per limit, removed on drop, the thread moved back
//! to the root first), never the device or the file.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use aio_core::engine::AlignedBuf;

/// Where cgroup v1 mounts the `blkio` controller.
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// The calling thread's writes to one block device, limited to a number a second while this
/// lives (`!Send`: the limit is on the thread that made it).
#[derive(Debug)]
pub struct WriteLimit {
    dir: PathBuf,
    tid: i32,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl WriteLimit {
    /// Limits the calling thread's writes to the block device at `device` to `iops` a second;
    /// `None`, said as `skipped:` (a failure under `AIO_REQUIRE_ALL_BACKENDS=1`), where the
    /// path is not a block device or cgroup v1's `blkio` throttling is not there to use (a
    /// cgroup v2 machine, or not root).
    pub fn on(device: &Path, iops: u32) -> Option<WriteLimit> {
        match Self::try_on(device, iops) {
            Ok(limit) => Some(limit),
            Err(why) => {
                super::skip(&format!("a write limit on {}: {why}", device.display()));
                None
            }
        }
    }

    fn try_on(device: &Path, iops: u32) -> Result<WriteLimit, String> {
        let meta = fs::metadata(device).map_err(|e| e.to_string())?;
        if !std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()) {
            return Err("not a block device".into());
        }
        let root = Path::new(BLKIO);
        if !root.join("blkio.throttle.write_iops_device").exists() {
            return Err(format!("no cgroup v1 blkio throttling at {BLKIO}"));
        }
        super::leftovers::sweep();
        // SAFETY: gettid(2) takes nothing and cannot fail.
        let tid = unsafe { libc::gettid() };
        let dir = root.join(format!("aio-rs-test-{}-{tid}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // From here on, dropping the limit removes the cgroup (and puts the thread back).
        let limit = WriteLimit {
            dir,
            tid,
            _not_send: std::marker::PhantomData,
        };
        let rdev = meta.rdev();
        let rule = format!("{}:{} {iops}", libc::major(rdev), libc::minor(rdev));
        limit.write("blkio.throttle.write_iops_device", &rule)?;
        limit.write("tasks", &tid.to_string())?;
        Ok(limit)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Writes `BLOCK` bytes at `offset` of `device` with `O_DIRECT` from this thread and
    /// returns once the write is done: the limit releases a cgroup's writes in the order they
    /// came, so every write held for this thread (or the threads it started) before this one
    /// has then gone to the device. Panics if the write fails.
    pub fn write_behind_the_held_ones(&self, device: &Path, offset: u64) {
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(device)
            .expect("open the device with O_DIRECT");
        let buf = AlignedBuf::new(super::fixtures::BLOCK);
        file.write_all_at(&buf, offset)
            .expect("the write behind the held ones");
    }
}

impl Drop for WriteLimit {
    fn drop(&mut self) {
        // Back to the root cgroup, then the empty cgroup can go. A thread the engine left
        // behind keeps it busy (`EBUSY`): it then stays, named by this process and thread.
        let _ = fs::write(Path::new(BLKIO).join("tasks"), self.tid.to_string());
        let _ = fs::remove_dir(&self.dir);
    }
}

/// The first `len` bytes of `device`, read with `O_DIRECT` (not from the page cache, which
/// direct writes that complete later need not update). `len` is a multiple of 4096.
pub fn read_direct(device: &Path, len: usize) -> Vec<u8> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .expect("open the device with O_DIRECT");
    let mut buf = AlignedBuf::new(len);
    file.read_exact_at(&mut buf, 0).expect("read the device");
    buf.to_vec()
}
