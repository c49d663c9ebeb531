//! [`SlotEntry`]: what building one slot's submission entry gives the engine.
//!
//! This module owns the type only; building entries is `entry.rs`'s, submitting them
//! `mod.rs`'s.

use io_uring::squeue;

/// One slot's submission entry and the registrations it uses (counted by the caller once the
/// entry is in the SQ).
pub(super) struct SlotEntry {
    /// The SQE, its user data set.
    pub(super) sqe: squeue::Entry,
    /// It names the file by its registered index.
    pub(super) fixed_file: bool,
    /// It reads or writes a registered buffer.
    pub(super) fixed_buffer: bool,
}
