//! The fast device (`--device loop[:SIZE]`): a loop device with direct I/O over a file in
//! `/dev/shm`.
//!
//! Such a device answers 4 KiB O_DIRECT reads asynchronously in tens of µs for Linux AIO and
//! io_uring alike, as an NVMe drive does: the setting in which the loop's own latency shows. A
//! file in tmpfs completes O_DIRECT inside the submitting syscall (so the engines never wait),
//! and this VM's virtual disk (about 80 µs, noisy) hides the loop's cost in the device's.
//!
//! This module owns the `--device` argument ([`LoopSpec`]), the device's life ([`LoopDevice`]:
//! the backing file written once, `losetup --find --show --direct-io=on`, the check that the
//! kernel really does direct I/O; detached and removed on drop and on a signal, and by the
//! kernel when the process dies any other way, `kill -9` included), and how the
//! subcommands use it: one image ([`LoopDevice::whole`]), one region per matrix disk
//! ([`LoopDevice::disks`]), or every job of a job file ([`LoopDevice::retarget`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fio::jobfile::JobDef;
use crate::targets::cleanup::{self, OnSignal};
use crate::targets::image::{free_bytes, DiskImage};
use crate::units::parse_size;

/// The device's size with a bare `--device loop`.
pub const DEFAULT_SIZE: u64 = 512 << 20;

/// The smallest region a matrix disk may get.
pub const MIN_DISK: u64 = 1 << 20;

/// Where the backing file goes.
const SHM: &str = "/dev/shm";

/// A `--device` argument: `loop` or `loop:SIZE` (fio's units, a multiple of 4k, at least 1m).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopSpec {
    /// The device's size in bytes.
    pub size: u64,
}

impl Default for LoopSpec {
    fn default() -> Self {
        LoopSpec { size: DEFAULT_SIZE }
    }
}

impl FromStr for LoopSpec {
    type Err = LoopError;

    fn from_str(s: &str) -> Result<LoopSpec, LoopError> {
        let unknown = || LoopError::UnknownDevice(s.to_string());
        let rest = s.strip_prefix("loop").ok_or_else(unknown)?;
        if rest.is_empty() {
            return Ok(LoopSpec::default());
        }
        let value = rest.strip_prefix(':').ok_or_else(unknown)?;
        let bad = |reason: String| LoopError::BadSize {
            value: value.to_string(),
            reason,
        };
        let size = parse_size(value).map_err(|e| bad(e.to_string()))?;
        if size < MIN_DISK {
            return Err(bad(format!(
                "SIZE '{value}' is less than the smallest device, 1m"
            )));
        }
        if size % 4096 != 0 {
            return Err(bad(format!(
                "SIZE '{value}' ({size} bytes) is not a multiple of 4k"
            )));
        }
        Ok(LoopSpec { size })
    }
}

impl LoopSpec {
    /// Each of `disks` matrix disks' region: the size split evenly, rounded down to 4 KiB;
    /// refused when that is less than [`MIN_DISK`] or than one `bs` block.
    pub fn per_disk(&self, disks: u64, bs: u64) -> Result<u64, LoopError> {
        let per_disk = self.size / disks.max(1) / 4096 * 4096;
        if per_disk < MIN_DISK.max(bs) {
            return Err(LoopError::DiskTooSmall {
                size_mib: self.size >> 20,
                disks,
                per_disk,
                least: MIN_DISK.max(bs),
            });
        }
        Ok(per_disk)
    }
}

/// Why the fast device cannot be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// Not a device this tool knows.
    #[error("--device {0}: unknown device (expected loop or loop:SIZE, e.g. loop:512m)")]
    UnknownDevice(String),
    /// SIZE in `loop:SIZE` is unusable.
    #[error("--device loop:{value}: {reason}")]
    BadSize {
        /// The SIZE as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A matrix disk would get too small a region.
    #[error(
        "--device loop: {size_mib} MiB over {disks} disks is {} KiB each, less than {} KiB \
         (give a larger SIZE, e.g. loop:{}m, or fewer --disks)",
        .per_disk >> 10,
        .least >> 10,
        (.least * .disks).div_ceil(1 << 20)
    )]
    DiskTooSmall {
        /// The device's size, MiB.
        size_mib: u64,
        /// The disks sharing it.
        disks: u64,
        /// What each would get, bytes.
        per_disk: u64,
        /// What each needs at least, bytes.
        least: u64,
    },
    /// losetup needs root.
    #[error("--device loop needs root (losetup)")]
    NotRoot,
    /// There is no /dev/shm.
    #[error("--device loop: {SHM} is missing or not a directory (the backing file goes there)")]
    NoShm,
    /// /dev/shm has too little room for the backing file.
    #[error("--device loop: {SHM} has {free_mib} MiB free, the backing file needs {need_mib} MiB (give a smaller SIZE)")]
    ShmTooSmall {
        /// Free space, MiB.
        free_mib: u64,
        /// The backing file, MiB.
        need_mib: u64,
    },
    /// losetup is not installed.
    #[error("--device loop: losetup is not installed (it is in util-linux: apt-get install -y util-linux)")]
    LosetupMissing,
    /// losetup failed.
    #[error("--device loop: `losetup {args}` failed ({status}): {stderr}")]
    LosetupFailed {
        /// Its arguments.
        args: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The device does not do direct I/O.
    #[error(
        "--device loop: {device} does not do direct I/O ({dio_file} reads '{dio}'); the \
         backing file's file system must take O_DIRECT (tmpfs does from Linux 6.6)"
    )]
    NoDirectIo {
        /// The device.
        device: String,
        /// The sysfs attribute read.
        dio_file: String,
        /// What it held.
        dio: String,
    },
    /// Writing the backing file, or opening the device, failed.
    #[error("--device loop: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
}

/// A loop device with direct I/O over a private file in `/dev/shm`. Dropping it detaches the
/// device (the drop returns once the kernel has, or after 5 s with a warning) and removes the
/// file; a signal does the same ([`crate::targets::cleanup`]).
#[derive(Debug)]
pub struct LoopDevice {
    /// `/dev/loopN`, once attached.
    device: Option<PathBuf>,
    size: u64,
    /// The backing file (removed when dropped, after the device is detached).
    backing: Option<DiskImage>,
    backing_path: PathBuf,
    /// An open fd on the device: with `LO_FLAGS_AUTOCLEAR` set, the kernel detaches the device
    /// when the last fd on it closes, which this one keeps from happening before the drop.
    holder: Option<std::fs::File>,
    _on_signal: OnSignal,
}

impl LoopDevice {
    /// Sets the device up: checks root and `/dev/shm`, writes the backing file
    /// (`/dev/shm/aio-bench-loop-PID.img`, a non-zero pattern), attaches it with
    /// `losetup --find --show --direct-io=on` and checks `/sys/block/loopN/loop/dio`. Whatever
    /// fails, nothing is left attached or on disk.
    pub fn attach(spec: LoopSpec) -> Result<LoopDevice, LoopError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(LoopError::NotRoot);
        }
        let shm = Path::new(SHM);
        if !shm.is_dir() {
            return Err(LoopError::NoShm);
        }
        let free = free_bytes(shm);
        if free < spec.size {
            return Err(LoopError::ShmTooSmall {
                free_mib: free >> 20,
                need_mib: spec.size.div_ceil(1 << 20),
            });
        }
        let backing_path = shm.join(backing_name());
        // Registered before the file exists: a signal at any point below undoes what is done.
        let on_signal = {
            let file = backing_path.clone();
            cleanup::on_signal(
                format!("loop device over {} detached, file removed", file.display()),
                move || {
                    for dev in attached_to(&file) {
                        let _ = losetup(&["-d", &dev]);
                    }
                    let _ = std::fs::remove_file(&file);
                },
            )
        };
        let mut dev = LoopDevice {
            device: None,
            size: spec.size,
            backing: None,
            backing_path: backing_path.clone(),
            holder: None,
            _on_signal: on_signal,
        };
        dev.backing = Some(
            DiskImage::create_buffered_named(backing_path.clone(), spec.size, 0x4c).map_err(
                |e| LoopError::Io {
                    what: format!("writing {}", backing_path.display()),
                    source: e,
                },
            )?,
        );
        let file = backing_path.to_string_lossy();
        let args = ["--find", "--show", "--direct-io=on", &file];
        let out = losetup(&args)?;
        let device = out.trim();
        if !device.starts_with("/dev/loop") {
            // Detach whatever it did attach to our file before saying so.
            for d in attached_to(&backing_path) {
                let _ = losetup(&["-d", &d]);
            }
            return Err(LoopError::LosetupFailed {
                args: args.join(" "),
                status: "exit status 0".into(),
                stderr: format!("printed '{device}', not a /dev/loopN device"),
            });
        }
        dev.device = Some(PathBuf::from(device));
        // Nothing left behind whatever ends the process: the device detaches itself when its
        // last fd closes (the holder's, at the latest when the process dies), and the backing
        // file loses its name (the device keeps it open), so the kernel frees both.
        let io_err = |what: String| move |e| LoopError::Io { what, source: e };
        let holder = std::fs::File::open(device).map_err(io_err(format!("opening {device}")))?;
        match set_autoclear(&holder) {
            Ok(()) => {
                dev.holder = Some(holder);
                std::fs::remove_file(&backing_path)
                    .map_err(io_err(format!("unlinking {}", backing_path.display())))?;
            }
            // Root without CAP_SYS_ADMIN (a container) may attach but not set the flag: the
            // drop and the signal handler still clean up, `kill -9` cannot be covered.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => eprintln!(
                "aio-bench: --device loop: the kernel refused autoclear on {device} ({e}); \
                 a kill -9 would leave it attached"
            ),
            Err(e) => return Err(io_err(format!("setting autoclear on {device}"))(e)),
        }
        let name = device.trim_start_matches("/dev/");
        let dio_file = format!("/sys/block/{name}/loop/dio");
        let dio = std::fs::read_to_string(&dio_file)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        if dio != "1" {
            return Err(LoopError::NoDirectIo {
                device: device.to_string(),
                dio_file,
                dio,
            });
        }
        Ok(dev)
    }

    /// The device, `/dev/loopN`.
    pub fn path(&self) -> &Path {
        self.device.as_deref().expect("set by attach")
    }

    /// Where the backing file was made in `/dev/shm`. It has no name once the device is
    /// attached: the device holds it open, and the kernel frees it when the device detaches.
    pub fn backing_file(&self) -> &Path {
        &self.backing_path
    }

    /// The whole device as one O_DIRECT image (`latency`, `vs-fio`).
    pub fn whole(&self) -> Result<DiskImage, LoopError> {
        self.region(0, self.size, None)
    }

    /// The matrix's disks: `count` regions of `per_disk` bytes one after another (see
    /// [`LoopSpec::per_disk`]), each with its own O_DIRECT fd; disk `i` is stamped for
    /// `--verify` with `bs` blocks when `stamped(i)`. The backing file already holds data, so
    /// the other regions are used as they are.
    pub fn disks(
        &self,
        count: usize,
        per_disk: u64,
        bs: usize,
        stamped: impl Fn(usize) -> bool,
    ) -> Result<Vec<DiskImage>, LoopError> {
        (0..count)
            .map(|i| self.region(i as u64 * per_disk, per_disk, stamped(i).then_some(bs)))
            .collect()
    }

    fn region(&self, base: u64, len: u64, stamp_bs: Option<usize>) -> Result<DiskImage, LoopError> {
        let path = self.path().to_path_buf();
        match stamp_bs {
            Some(bs) => DiskImage::region_stamped(path, base, len, bs),
            None => DiskImage::region(path, base, len),
        }
        .map_err(|e| LoopError::Io {
            what: format!("{} at {base}: {len} bytes", self.path().display()),
            source: e,
        })
    }

    /// Points a job at the device: `filename=` the device, no `directory=`, `size=` at most
    /// the device's (the whole device when the job has none).
    pub fn retarget(&self, def: &mut JobDef) {
        def.filename = Some(self.path().to_path_buf());
        def.directory = None;
        def.size = Some(def.size.map_or(self.size, |s| s.min(self.size)));
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(dev) = &self.device {
            // With the holder still open the kernel only marks the device (autoclear, already
            // set): it detaches when the holder closes, just below.
            if let Err(e) = losetup(&["-d", &dev.to_string_lossy()]) {
                eprintln!("aio-bench: {e}");
            }
        }
        self.holder = None;
        if let Some(dev) = &self.device {
            wait_detached(dev, &self.backing_path, DETACH_WAIT);
        }
        // Then `backing` drops (the file, if it still has its name, is removed) and
        // `_on_signal` unregisters.
    }
}

/// How long a drop waits for the kernel to detach the device.
const DETACH_WAIT: Duration = Duration::from_secs(5);

/// Waits until `device` no longer serves `backing` (its `/sys/block/loopN/loop` directory is
/// gone, or names another file), at most `limit`; says so on stderr if it still does.
///
/// The kernel detaches an autoclear device at the release of its last opener, which need not
/// be this process's last `close`: a child that another thread is spawning holds a copy of
/// every fd until its `exec` closes them (close-on-exec), and a kernel thread's last `fput`
/// (a Linux AIO completion's, an io_uring ring's teardown) is deferred to a workqueue. So the
/// device may stay bound for a moment after every fd here is closed, and a caller that lists
/// loop devices right after the drop would still see it.
fn wait_detached(device: &Path, backing: &Path, limit: Duration) {
    let name = device.to_string_lossy();
    let name = name.trim_start_matches("/dev/");
    let status = format!("/sys/block/{name}/loop/backing_file");
    let ours = backing.to_string_lossy();
    let bound =
        || std::fs::read_to_string(&status).is_ok_and(|file| file.trim_end().starts_with(&*ours));
    let deadline = Instant::now() + limit;
    while bound() {
        if Instant::now() >= deadline {
            eprintln!(
                "aio-bench: {} still serves {} {limit:?} after its last fd closed",
                device.display(),
                backing.display()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `struct loop_info64` (`linux/loop.h`), for `LOOP_GET_STATUS64` / `LOOP_SET_STATUS64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// Sets `LO_FLAGS_AUTOCLEAR` on the loop device open as `device` (what `mount -o loop` does):
/// the kernel detaches it when the last fd on it closes.
fn set_autoclear(device: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
    // SAFETY: all-zero is a valid `loop_info64` (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: `device` is an open fd; LOOP_GET_STATUS64 writes one `loop_info64` into `info`,
    // which is that struct (size checked above) and lives across the call.
    if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_GET_STATUS64, &mut info) } != 0 {
        return Err(io::Error::last_os_error());
    }
    info.lo_flags |= LO_FLAGS_AUTOCLEAR;
    // SAFETY: as above; LOOP_SET_STATUS64 only reads `info` (the status just read, one
    // settable flag added: offset and size unchanged, so the device keeps its size).
    if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_STATUS64, &info) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The backing file's name: `aio-bench-loop-PID.img`, then `aio-bench-loop-PID-N.img` for
/// further devices of the same process.
fn backing_name() -> String {
    static DEVICES: AtomicU64 = AtomicU64::new(0);
    match DEVICES.fetch_add(1, Ordering::Relaxed) {
        0 => format!("aio-bench-loop-{}.img", std::process::id()),
        n => format!("aio-bench-loop-{}-{n}.img", std::process::id()),
    }
}

/// Runs losetup with `args`; its stdout, or why it failed.
fn losetup(args: &[&str]) -> Result<String, LoopError> {
    let out = Command::new("losetup").args(args).output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            LoopError::LosetupMissing
        } else {
            LoopError::LosetupFailed {
                args: args.join(" "),
                status: "not started".into(),
                stderr: e.to_string(),
            }
        }
    })?;
    if !out.status.success() {
        return Err(LoopError::LosetupFailed {
            args: args.join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The loop devices attached to `file` (`losetup -j FILE`: lines `/dev/loopN: [...]: (FILE)`).
fn attached_to(file: &Path) -> Vec<String> {
    let Ok(out) = losetup(&["-j", &file.to_string_lossy()]) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| dev.to_string()))
        .filter(|dev| dev.starts_with("/dev/loop"))
        .collect()
}

#[cfg(test)]
#[path = "loopdev_tests.rs"]
mod tests;
