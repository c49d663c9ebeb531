//! Per-request flags: what a read or write asks of the kernel beyond its bytes.
//!
//! This module owns [`RwFlags`] only, a leaf that requests, completions and refusals all name.
//! It performs no I/O.

use std::fmt;
use std::ops::BitOr;

/// Per-request flags of a read or write (the kernel's `RWF_*`): an opaque set, combined with
/// `|`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RwFlags(libc::c_int);

impl RwFlags {
    /// No flags.
    pub const NONE: RwFlags = RwFlags(0);
    /// Forced unit access, as a virtio-blk or SCSI device means it: the write is on stable
    /// storage when it completes (`RWF_DSYNC`, like `O_DSYNC` for this write only). Writes
    /// only.
    pub const FUA: RwFlags = RwFlags(libc::RWF_DSYNC);
    /// Fail with `EAGAIN` (kind `WouldBlock`) instead of waiting for a lock, a page or a
    /// block allocation (`RWF_NOWAIT`). Engines then report `EAGAIN` instead of retrying it;
    /// a file that cannot honour it completes with kind `Unsupported`.
    pub const NOWAIT: RwFlags = RwFlags(libc::RWF_NOWAIT);

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: RwFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no flag is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The kernel's `RWF_*` bits, for an engine to hand over (`aio_rw_flags`, an SQE's
    /// `rw_flags`, `preadv2` / `pwritev2`).
    pub fn to_rwf(self) -> libc::c_int {
        self.0
    }
}

impl BitOr for RwFlags {
    type Output = RwFlags;
    fn bitor(self, rhs: RwFlags) -> RwFlags {
        RwFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for RwFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        if self.contains(RwFlags::FUA) {
            names.push("FUA");
        }
        if self.contains(RwFlags::NOWAIT) {
            names.push("NOWAIT");
        }
        write!(f, "RwFlags({})", names.join(" | "))
    }
}
