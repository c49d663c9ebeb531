//! One writer per image: librbd's exclusive lock, held explicitly, and the record that lets a
//! restarted process take back the lock its dead predecessor held.
//!
//! This module owns acquiring, breaking and releasing the lock, and the lock records. It never
//! opens an image.
//!
//! * **Held, not passed around.** Without an explicit lock, librbd hands an image's lock to
//!   whichever client writes, back and forth; [`RbdImage::lock_exclusive`]
//!   (`rbd_lock_acquire`) keeps it until released, and another client's writes fail
//!   (`EROFS`) meanwhile.
//! * **Live holders win.** A lock held by another client is [`RbdError::Locked`], naming it.
//! * **Dead predecessors are broken.** A process killed with the lock leaves it held (its
//!   watch lingers for 30 s, and librbd waits for the holder to answer). With
//!   [`LockRecords`], the holder writes down which client it is, with its process; a
//!   successor finding the lock held by exactly that client, whose process is gone (same boot,
//!   pid gone or reused), breaks it (`rbd_lock_break`, which blocklists the old client so it
//!   can never write again) and takes it. A holder not in the records is never broken.

use std::ffi::{c_char, CStr};
use std::path::{Path, PathBuf};

use crate::error::{c_string, check, RbdError};
use crate::image::{call_error, HeldLock, RbdImage};
use crate::sys;

/// Where a process keeps who holds which image's lock: a directory of small files, one per
/// image, kept across the process's crash (a daemon's state directory).
#[derive(Debug, Clone)]
pub struct LockRecords {
    dir: PathBuf,
}

impl LockRecords {
    /// Records in `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(LockRecords { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_for(&self, fsid: &str, image: &RbdImage) -> PathBuf {
        let name: String = format!("{fsid}_{}", image.spec())
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("{name}.lock"))
    }
}

/// What taking the lock did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockTaken {
    /// Nobody held it; now this client does.
    Acquired,
    /// This process's dead predecessor held it: broken (that client blocklisted), then taken.
    BrokeStale {
        /// The dead holder (its client's address, `127.0.0.1:0/2551908805`).
        holder: String,
    },
    /// The image has no exclusive-lock feature: nothing stops another writer.
    Unsupported,
}

/// This process as a record names it: `pid start-time boot-id`.
fn this_process() -> String {
    let pid = std::process::id();
    format!(
        "{pid} {} {}",
        start_time(pid).unwrap_or_default(),
        boot_id()
    )
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A process's start time (field 22 of `/proc/PID/stat`): with the pid, it names one process.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// Whether the process a record names is gone.
fn is_gone(process: &str) -> bool {
    let mut fields = process.split_whitespace();
    let (Some(pid), Some(start), Some(boot)) = (fields.next(), fields.next(), fields.next()) else {
        return false;
    };
    if boot != boot_id() {
        return true;
    }
    match pid.parse::<u32>() {
        Ok(pid) => start_time(pid).as_deref() != Some(start),
        Err(_) => false,
    }
}

impl RbdImage {
    /// The clients holding the image's exclusive lock (none, or one). librbd answers this
    /// only on an image opened read-write (`EINVAL` read-only).
    pub fn lock_owners(&self) -> Result<Vec<String>, RbdError> {
        let mut mode = 0;
        let mut owners = [std::ptr::null_mut::<c_char>(); 8];
        let mut count = owners.len();
        // SAFETY: an open image; `owners` has room for `count` pointers, which librbd fills
        // and `rbd_lock_get_owners_cleanup` frees below.
        let ret = unsafe {
            (self.lib.rbd_lock_get_owners)(
                self.open_handle()?,
                &mut mode,
                owners.as_mut_ptr(),
                &mut count,
            )
        };
        match check(ret.into()) {
            Ok(_) => {}
            Err(libc::ENOENT) => return Ok(Vec::new()),
            Err(errno) => return Err(call_error("rbd_lock_get_owners", self.spec(), errno)),
        }
        let names = owners[..count]
            .iter()
            // SAFETY: librbd set `count` NUL-terminated strings.
            .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .collect();
        // SAFETY: the `count` strings librbd allocated, freed once.
        unsafe { (self.lib.rbd_lock_get_owners_cleanup)(owners.as_mut_ptr(), count) };
        Ok(names)
    }

    /// Takes the image's exclusive lock and keeps it until [`release_lock`](Self::release_lock)
    /// or close. A live holder is [`RbdError::Locked`]; with `records`, a holder this process's
    /// dead predecessor recorded is broken first (see the module's notes).
    pub fn lock_exclusive(&self, records: Option<&LockRecords>) -> Result<LockTaken, RbdError> {
        if self.features()? & sys::FEATURE_EXCLUSIVE_LOCK == 0 {
            return Ok(LockTaken::Unsupported);
        }
        let record = match records {
            Some(r) => Some(r.path_for(&self.cluster().fsid()?, self)),
            None => None,
        };
        let mut taken = LockTaken::Acquired;
        if let Some(holder) = self.lock_owners()?.into_iter().next() {
            let recorded = record
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|r| {
                    r.split_once('\n')
                        .map(|(o, p)| (o.to_string(), p.to_string()))
                });
            match recorded {
                Some((owner, process)) if owner == holder && is_gone(&process) => {
                    self.break_lock(&holder)?;
                    taken = LockTaken::BrokeStale { holder };
                }
                _ => {
                    return Err(RbdError::Locked {
                        image: self.spec().to_string(),
                        holder,
                    })
                }
            }
        }
        // SAFETY: an open image.
        let ret =
            unsafe { (self.lib.rbd_lock_acquire)(self.open_handle()?, sys::LOCK_MODE_EXCLUSIVE) };
        if let Err(errno) = check(ret.into()) {
            // Taken by another client since the look above, or refused.
            let holder = self.lock_owners().ok().and_then(|o| o.into_iter().next());
            return Err(match (errno, holder) {
                (libc::EROFS | libc::EBUSY | libc::ETIMEDOUT, Some(holder)) => RbdError::Locked {
                    image: self.spec().to_string(),
                    holder,
                },
                (errno, _) => call_error("rbd_lock_acquire", self.spec(), errno),
            });
        }
        if let Some(path) = &record {
            // Owners are named by their client's address (`127.0.0.1:0/2551908805`): this
            // client's is what the lock now says.
            let me = self.lock_owners()?.into_iter().next().unwrap_or_default();
            let text = format!("{me}\n{}\n", this_process());
            std::fs::write(path, text).map_err(|e| RbdError::Call {
                call: "write lock record",
                target: path.display().to_string(),
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })?;
        }
        *self.lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(HeldLock { record });
        Ok(taken)
    }

    fn break_lock(&self, holder: &str) -> Result<(), RbdError> {
        let owner = c_string(holder, "lock owner")?;
        // SAFETY: an open image; a NUL-terminated owner name.
        let ret = unsafe {
            (self.lib.rbd_lock_break)(
                self.open_handle()?,
                sys::LOCK_MODE_EXCLUSIVE,
                owner.as_ptr(),
            )
        };
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_lock_break", self.spec(), errno))
    }

    /// Whether this client holds the image's exclusive lock now.
    pub fn is_lock_owner(&self) -> Result<bool, RbdError> {
        let mut owner = 0;
        // SAFETY: an open image; a live out-value.
        let ret =
            unsafe { (self.lib.rbd_is_exclusive_lock_owner)(self.open_handle()?, &mut owner) };
        check(ret.into())
            .map_err(|errno| call_error("rbd_is_exclusive_lock_owner", self.spec(), errno))?;
        Ok(owner != 0)
    }

    /// Releases the lock [`lock_exclusive`](Self::lock_exclusive) took (and its record);
    /// nothing if none is held.
    pub fn release_lock(&self) -> Result<(), RbdError> {
        let handle = self.open_handle()?;
        self.release_held(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_this_process_alive_and_a_reused_pid_or_another_boot_gone() {
        let me = this_process();
        assert!(!is_gone(&me), "{me}");
        let pid = std::process::id();
        assert!(is_gone(&format!("{pid} 1 {}", boot_id())));
        assert!(is_gone(&format!(
            "{pid} {} another-boot",
            start_time(pid).unwrap()
        )));
        // A record it cannot read is never taken for a dead process.
        assert!(!is_gone("garbage"));
    }
}
