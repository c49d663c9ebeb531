//! The write-back that makes a qcow2 image's metadata changes reach its file before the
//! requests that made them end (a group commit).
//!
//! This module owns [`WriteBack`]; it never decides which requests need it (`requests.rs`
//! does: allocating writes, discards, write-zeroes).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use imago::FormatAccess;

use super::storage::EngineStorage;

/// Writes imago's cached metadata back to the file for every request that asked before the
/// write-back began, one write-back at a time (a group commit): the allocating writes of a
/// batch wait for one write-back, not one each.
#[derive(Default)]
pub(crate) struct WriteBack {
    /// Write-backs asked for so far: each asker's ticket.
    asked: AtomicU64,
    /// Every ticket up to this one is covered by a write-back that has finished.
    done: AtomicU64,
    /// One write-back at a time; the askers queue here, and most find themselves covered.
    running: tokio::sync::Mutex<()>,
}

impl WriteBack {
    /// Returns once a write-back that began after this call has finished (or fails with it).
    pub(crate) async fn run(&self, access: &FormatAccess<EngineStorage>) -> io::Result<()> {
        // The caller's metadata change is in imago's cache before its ticket is taken, and a
        // write-back covers every ticket taken before it starts.
        let ticket = self.asked.fetch_add(1, Ordering::AcqRel) + 1;
        let _one = self.running.lock().await;
        if self.done.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let covers = self.asked.load(Ordering::Acquire);
        access.flush().await?;
        self.done.fetch_max(covers, Ordering::AcqRel);
        Ok(())
    }
}
