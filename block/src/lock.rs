//! Image locks that QEMU's tools see, and that see theirs: OFD locks on single bytes of the
//! image, at the offsets and with the meaning of QEMU's `file-posix` driver.
//!
//! This module owns the lock bytes, the check made when an image is opened and the release
//! when its holder goes; it opens no image and never reads or writes one (a lock is taken on
//! a file its caller opened).
//!
//! QEMU gives every user of an image a set of permissions it holds and a set it lets others
//! hold (`BLK_PERM_*`: consistent read, write, write unchanged, resize). On a file it shows
//! them as shared (read) OFD locks on single bytes:
//!
//! * byte `100 + bit` for each permission held;
//! * byte `200 + bit` for each permission *not* shared with others.
//!
//! An opener first takes its own bytes, then looks for conflicts: someone else's `200 + bit`
//! for a permission it wants to hold (`Failed to get "write" lock`), someone else's
//! `100 + bit` for a permission it will not share (`Failed to get shared "write" lock`).
//! Taking before looking means two openers racing each other both see the other, never
//! neither. OFD locks belong to the open file description: a process's own locks never
//! conflict with themselves, and they go when the last descriptor of that description is
//! closed (a SIGKILLed holder leaves none behind).
//!
//! * [`Access::disk`]: what a served disk holds, as QEMU's own VM disk without `share-rw`: a
//!   writable one holds read and write and shares neither write nor resize, so a `qemu-io`
//!   writer, a `qemu-img resize` or a second daemon writing the image are refused while
//!   `qemu-img info -U` works.
//! * [`Access::qcow2_file`]: a qcow2 image's own file: its metadata is written even when the
//!   guest does not write, so it never shares write or resize (QEMU's format rule: `share-rw`
//!   does not make two qcow2 writers safe).
//! * [`Access::backing`]: a backing file: read, everything shared (QEMU's tools lock a
//!   backing file so).
//! * [`LockMode`]: QEMU's `locking=auto|on|off`: `auto` locks where the file system offers OFD
//!   locks and serves unlocked where it does not; `on` refuses the image there; `off` takes
//!   and checks nothing.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where the bytes of held permissions start (QEMU's `RAW_LOCK_PERM_BASE`).
pub const PERM_BASE: u64 = 100;
/// Where the bytes of permissions not shared start (QEMU's `RAW_LOCK_SHARED_BASE`).
pub const SHARED_BASE: u64 = 200;

/// A set of QEMU's block permissions (`BLK_PERM_*`, the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Permissions(u8);

impl Permissions {
    /// None at all.
    pub const NONE: Permissions = Permissions(0);
    /// Reads see consistent data (`BLK_PERM_CONSISTENT_READ`).
    pub const CONSISTENT_READ: Permissions = Permissions(0x01);
    /// Writes that change the data (`BLK_PERM_WRITE`).
    pub const WRITE: Permissions = Permissions(0x02);
    /// Writes that leave the data as it reads (`BLK_PERM_WRITE_UNCHANGED`).
    pub const WRITE_UNCHANGED: Permissions = Permissions(0x04);
    /// Changing the size (`BLK_PERM_RESIZE`).
    pub const RESIZE: Permissions = Permissions(0x08);
    /// Every permission QEMU locks (`BLK_PERM_ALL`).
    pub const ALL: Permissions = Permissions(0x0f);
    /// The bits, in QEMU's order: the bit's index is its lock byte's offset from the bases.
    const EACH: [Permissions; 4] = [
        Self::CONSISTENT_READ,
        Self::WRITE,
        Self::WRITE_UNCHANGED,
        Self::RESIZE,
    ];

    /// The set's bits, as QEMU numbers them.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Whether every permission of `other` is in the set.
    pub fn contains(self, other: Permissions) -> bool {
        self.0 & other.0 == other.0
    }

    /// The permissions of [`ALL`](Self::ALL) not in the set.
    pub fn complement(self) -> Permissions {
        Permissions(!self.0 & Self::ALL.0)
    }

    /// The single permissions in the set with their bit index, in QEMU's order.
    fn each(self) -> impl Iterator<Item = (u64, Permissions)> {
        (0u64..)
            .zip(Self::EACH)
            .filter(move |(_, p)| self.contains(*p))
    }

    /// QEMU's name of a single permission (`bdrv_perm_names`), or the names joined.
    fn name(self) -> String {
        let names: Vec<&str> = self
            .each()
            .map(|(_, p)| match p {
                Self::CONSISTENT_READ => "consistent read",
                Self::WRITE => "write",
                Self::WRITE_UNCHANGED => "write unchanged",
                _ => "resize",
            })
            .collect();
        names.join(", ")
    }
}

impl std::ops::BitOr for Permissions {
    type Output = Permissions;
    fn bitor(self, other: Permissions) -> Permissions {
        Permissions(self.0 | other.0)
    }
}

impl fmt::Display for Permissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("none");
        }
        f.write_str(&self.name())
    }
}

/// What one user of an image holds and what it lets others hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access {
    /// The permissions taken.
    pub held: Permissions,
    /// The permissions others may hold beside it.
    pub shared: Permissions,
}

impl Access {
    /// A served disk, as QEMU's VM disk (a device without `share-rw`) takes its image: read,
    /// and write when `writable`; others may read and write what reads unchanged, and with
    /// `share_rw` also write (the operator says two writers are safe: a cluster file system
    /// on the disk). Resize is never shared: the disk's size is the guest's.
    pub fn disk(writable: bool, share_rw: bool) -> Access {
        let mut held = Permissions::CONSISTENT_READ;
        if writable {
            held = held | Permissions::WRITE;
        }
        let mut shared = Permissions::CONSISTENT_READ | Permissions::WRITE_UNCHANGED;
        if share_rw {
            shared = shared | Permissions::WRITE;
        }
        Access { held, shared }
    }

    /// A qcow2 image's file, as QEMU's format layer takes it: its metadata changes even when
    /// the guest does not write, so a writable one holds write and resize (the file grows as
    /// clusters are allocated), and no qcow2 file ever shares write or resize.
    pub fn qcow2_file(writable: bool) -> Access {
        let mut held = Permissions::CONSISTENT_READ;
        if writable {
            held = held | Permissions::WRITE | Permissions::RESIZE;
        }
        Access {
            held,
            shared: Permissions::CONSISTENT_READ | Permissions::WRITE_UNCHANGED,
        }
    }

    /// A backing file: read, everything shared (as QEMU's tools lock one).
    pub fn backing() -> Access {
        Access {
            held: Permissions::CONSISTENT_READ,
            shared: Permissions::ALL,
        }
    }
}

/// QEMU's `locking=` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockMode {
    /// Lock where the file system offers OFD locks; serve unlocked where it does not (QEMU's
    /// default).
    #[default]
    Auto,
    /// Lock, and refuse an image whose file system offers no OFD locks.
    On,
    /// Take and check no lock: the operator answers for every other user of the image.
    Off,
}

impl LockMode {
    /// The option's value.
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Auto => "auto",
            LockMode::On => "on",
            LockMode::Off => "off",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `locking=` value that is none of `auto`, `on`, `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("locking={0}: expected auto, on or off")]
pub struct UnknownLockMode(pub String);

impl FromStr for LockMode {
    type Err = UnknownLockMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(LockMode::Auto),
            "on" => Ok(LockMode::On),
            "off" => Ok(LockMode::Off),
            other => Err(UnknownLockMode(other.to_string())),
        }
    }
}

/// Why an image's locks could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another process holds a lock byte that conflicts: it does not share a permission
    /// this opener wants (`shared: false`), or it holds one this opener does not share
    /// (`shared: true`). QEMU's words.
    #[error(
        "Failed to get {}\"{permission}\" lock: is another process using the image [{}]?",
        if *.shared { "shared " } else { "" },
        .path.display()
    )]
    Conflict {
        /// The image.
        path: PathBuf,
        /// The permission in conflict (one).
        permission: Permissions,
        /// Whether it is a permission this opener would not share (held by the other).
        shared: bool,
    },
    /// A lock byte could not be taken (someone holds it exclusively, or the call failed).
    #[error("Failed to lock byte {byte} of {}: {source}", .path.display())]
    Byte {
        /// The image.
        path: PathBuf,
        /// The byte's offset.
        byte: u64,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The image's file could not be opened or its descriptor duplicated for the lock.
    #[error("image {}: {source}", .path.display())]
    Io {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `locking=on`, and the image's file system offers no OFD locks.
    #[error(
        "image {}: locking=on, but its file system offers no OFD locks ({source}); \
         give locking=off to serve it unlocked",
        .path.display()
    )]
    Unsupported {
        /// The image.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

impl LockError {
    /// The text QEMU's QMP gives for the same refusal (`GenericError`'s `desc`): the first
    /// line of its message, without the hint naming the image.
    pub fn qemu_desc(&self) -> String {
        match self {
            LockError::Conflict {
                permission, shared, ..
            } => format!(
                "Failed to get {}\"{permission}\" lock",
                if *shared { "shared " } else { "" }
            ),
            LockError::Byte { byte, .. } => format!("Failed to lock byte {byte}"),
            LockError::Io { .. } | LockError::Unsupported { .. } => self.to_string(),
        }
    }
}

impl From<LockError> for io::Error {
    fn from(e: LockError) -> Self {
        let kind = match &e {
            LockError::Conflict { .. } => io::ErrorKind::ResourceBusy,
            LockError::Byte { source, .. }
            | LockError::Io { source, .. }
            | LockError::Unsupported { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// One `fcntl` OFD lock call on the single byte at `byte`: `F_OFD_SETLK` with `l_type`, or
/// `F_OFD_GETLK` asking whether a lock of `l_type` would be granted. Returns what `GETLK`
/// left in `l_type` (`F_UNLCK`: nobody else holds a conflicting lock).
fn ofd(fd: BorrowedFd<'_>, cmd: libc::c_int, l_type: libc::c_int, byte: u64) -> io::Result<i32> {
    // SAFETY: an all-zero `flock` is a valid value of the plain C struct (`l_pid` must be 0
    // for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    // SAFETY: `fd` is an open descriptor borrowed for the call, and `fl` a valid `flock` the
    // kernel reads (and, for GETLK, writes) during the call only.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::from(fl.l_type))
}

/// Whether an error says the file system (or kernel) offers no OFD locks.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS)
    )
}

/// The locks one user holds on one image, released when dropped (or when the process ends,
/// whatever way it ends: the kernel drops OFD locks with the file).
///
/// It keeps its own descriptor of the image's open file description, so the image's file
/// may be closed first. An `ImageLock` of `locking=off` (or of `auto` where the file system
/// has no OFD locks) holds nothing: [`is_locked`](Self::is_locked) says which.
#[derive(Debug)]
pub struct ImageLock {
    /// A descriptor of the locked open file description (None: nothing is locked).
    file: Option<File>,
    path: PathBuf,
    access: Access,
}

impl ImageLock {
    /// Takes `access`'s lock bytes on `file` (the image at `path`, opened by the caller),
    /// then refuses the image if another process holds a byte that conflicts (releasing
    /// what it took), as QEMU's `raw_handle_perm_lock` does.
    pub fn acquire(
        file: &File,
        path: &Path,
        access: Access,
        mode: LockMode,
    ) -> Result<ImageLock, LockError> {
        let unlocked = || ImageLock {
            file: None,
            path: path.to_path_buf(),
            access,
        };
        if mode == LockMode::Off {
            return Ok(unlocked());
        }
        let own = file.try_clone().map_err(|source| LockError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let lock = ImageLock {
            file: Some(own),
            path: path.to_path_buf(),
            access,
        };
        match lock.take_and_check() {
            Ok(()) => Ok(lock),
            Err(LockError::Byte { source, .. }) if unsupported(&source) => {
                drop(lock);
                match mode {
                    LockMode::On => Err(LockError::Unsupported {
                        path: path.to_path_buf(),
                        source,
                    }),
                    _ => Ok(unlocked()),
                }
            }
            // Dropping `lock` releases the bytes taken.
            Err(e) => Err(e),
        }
    }

    /// Takes the bytes, then looks for another process's conflicting ones.
    fn take_and_check(&self) -> Result<(), LockError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let fd = file.as_fd();
        let byte_error = |byte: u64| {
            move |source| LockError::Byte {
                path: self.path.clone(),
                byte,
                source,
            }
        };
        for byte in self.bytes() {
            ofd(fd, libc::F_OFD_SETLK, libc::F_RDLCK, byte).map_err(byte_error(byte))?;
        }
        // QEMU's order: every permission this opener holds (does anyone refuse to share
        // it?), then every one it refuses to share (does anyone hold it?).
        let held = self.access.held.each();
        let unshared = self.access.shared.complement().each();
        let checks = (held.map(|(bit, p)| (SHARED_BASE + bit, p, false)))
            .chain(unshared.map(|(bit, p)| (PERM_BASE + bit, p, true)));
        for (byte, permission, shared) in checks {
            let other =
                ofd(fd, libc::F_OFD_GETLK, libc::F_WRLCK, byte).map_err(byte_error(byte))?;
            if other != libc::F_UNLCK {
                return Err(LockError::Conflict {
                    path: self.path.clone(),
                    permission,
                    shared,
                });
            }
        }
        Ok(())
    }

    /// The bytes this user's locks cover: its held permissions' and those it does not share.
    fn bytes(&self) -> impl Iterator<Item = u64> {
        let held = self.access.held.each().map(|(bit, _)| PERM_BASE + bit);
        let unshared = self
            .access
            .shared
            .complement()
            .each()
            .map(|(bit, _)| SHARED_BASE + bit);
        held.chain(unshared)
    }

    /// Whether locks are held (false for `locking=off`, and for `auto` where the file system
    /// offers no OFD locks).
    pub fn is_locked(&self) -> bool {
        self.file.is_some()
    }

    /// What this user holds and shares.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The image locked.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ImageLock {
    fn drop(&mut self) {
        let Some(file) = &self.file else {
            return;
        };
        // The image's own descriptor may outlive this one (same open file description), so
        // the bytes are released here rather than left to the last close.
        for byte in self.bytes() {
            let _ = ofd(file.as_fd(), libc::F_OFD_SETLK, libc::F_UNLCK, byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        (dir, path)
    }

    fn open(path: &Path) -> File {
        File::options().read(true).write(true).open(path).unwrap()
    }

    #[test]
    fn a_writer_refuses_a_second_writer_and_lets_readers_in() {
        let (_dir, path) = image();
        let first =
            ImageLock::acquire(&open(&path), &path, Access::disk(true, false), LockMode::On)
                .unwrap();
        assert!(first.is_locked());
        // Another open file description is another user, even in this process.
        let e = ImageLock::acquire(
            &open(&path),
            &path,
            Access::disk(true, false),
            LockMode::Auto,
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("Failed to get \"write\" lock") && text.contains("disk.img"),
            "{text}"
        );
        assert_eq!(e.qemu_desc(), "Failed to get \"write\" lock");
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::ResourceBusy);
        // A reader that shares write gets in; one that does not is refused (shared lock).
        let backing =
            ImageLock::acquire(&open(&path), &path, Access::backing(), LockMode::On).unwrap();
        let e = ImageLock::acquire(
            &open(&path),
            &path,
            Access::disk(false, false),
            LockMode::On,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                LockError::Conflict {
                    permission: Permissions::WRITE,
                    shared: true,
                    ..
                }
            ),
            "{e}"
        );
        drop(backing);
        // Released on drop: the second writer gets in.
        drop(first);
        ImageLock::acquire(&open(&path), &path, Access::disk(true, false), LockMode::On).unwrap();
    }

    #[test]
    fn a_refused_opener_leaves_no_byte_behind() {
        let (_dir, path) = image();
        let holder =
            ImageLock::acquire(&open(&path), &path, Access::qcow2_file(true), LockMode::On)
                .unwrap();
        let refused = open(&path);
        ImageLock::acquire(&refused, &path, Access::disk(true, false), LockMode::On).unwrap_err();
        drop(holder);
        // Had the refused opener kept its bytes (101: write held), a writer that does not
        // share write would now be refused.
        ImageLock::acquire(&open(&path), &path, Access::qcow2_file(true), LockMode::On).unwrap();
    }

    #[test]
    fn share_rw_lets_two_writers_in_and_off_checks_nothing() {
        let (_dir, path) = image();
        let a = ImageLock::acquire(&open(&path), &path, Access::disk(true, true), LockMode::On)
            .unwrap();
        let b = ImageLock::acquire(&open(&path), &path, Access::disk(true, true), LockMode::On)
            .unwrap();
        assert!(a.is_locked() && b.is_locked());
        let off = ImageLock::acquire(&open(&path), &path, Access::qcow2_file(true), LockMode::Off)
            .unwrap();
        assert!(!off.is_locked());
        ImageLock::acquire(&open(&path), &path, Access::qcow2_file(true), LockMode::On)
            .unwrap_err();
    }

    #[test]
    fn names_and_modes_read_as_qemus() {
        assert_eq!(Permissions::WRITE.to_string(), "write");
        assert_eq!(
            (Permissions::CONSISTENT_READ | Permissions::RESIZE).to_string(),
            "consistent read, resize"
        );
        assert_eq!(Permissions::NONE.to_string(), "none");
        assert_eq!(
            Permissions::WRITE.complement(),
            Permissions::CONSISTENT_READ | Permissions::WRITE_UNCHANGED | Permissions::RESIZE
        );
        assert_eq!("auto".parse::<LockMode>().unwrap(), LockMode::Auto);
        assert_eq!("off".parse::<LockMode>().unwrap(), LockMode::Off);
        assert_eq!(
            "yes".parse::<LockMode>().unwrap_err().to_string(),
            "locking=yes: expected auto, on or off"
        );
    }
}
