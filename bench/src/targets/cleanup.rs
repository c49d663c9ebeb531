//! Undoing what a run set up (a loop device), also when a signal ends it, and removing what
//! runs of earlier versions left behind.
//!
//! Guards undo their work in `Drop`; a signal ends the process without running destructors, so
//! a guard also registers with [`on_signal`] what a signal must undo. The first registration
//! installs one `ctrlc` handler (SIGINT, and with ctrlc's `termination` feature SIGTERM and
//! SIGHUP) that runs every pending undo, newest first, and exits with code 130. A guard that
//! has undone its work drops its [`OnSignal`], which unregisters the undo without running it.
//!
//! This module owns the handler and the list; what each undo does belongs to its guard
//! ([`crate::targets::loopdev::LoopDevice`]).

use std::io;
use std::path::Path;
use std::sync::{Mutex, Once, PoisonError};

/// What a signal must undo, with what to say when it did.
struct Undo {
    id: u64,
    done: String,
    undo: Box<dyn FnOnce() + Send>,
}

/// The undos pending, and the next id.
static PENDING: Mutex<(u64, Vec<Undo>)> = Mutex::new((0, Vec::new()));

/// Installs the handler once.
static HANDLER: Once = Once::new();

/// An undo registered with [`on_signal`]; dropping it unregisters the undo without running it.
#[derive(Debug)]
#[must_use = "dropping it unregisters the undo at once"]
pub struct OnSignal(u64);

/// Registers `undo` to run if a signal ends the process before the returned guard is dropped;
/// `done` is printed after it ran ("aio-bench: interrupted; {done}").
pub fn on_signal(done: impl Into<String>, undo: impl FnOnce() + Send + 'static) -> OnSignal {
    HANDLER.call_once(|| {
        // Another handler already set (a library caller's own) keeps precedence.
        let _ = ctrlc::set_handler(run_all_and_exit);
    });
    let mut pending = PENDING.lock().unwrap_or_else(PoisonError::into_inner);
    let id = pending.0;
    pending.0 += 1;
    pending.1.push(Undo {
        id,
        done: done.into(),
        undo: Box::new(undo),
    });
    OnSignal(id)
}

impl Drop for OnSignal {
    fn drop(&mut self) {
        let mut pending = PENDING.lock().unwrap_or_else(PoisonError::into_inner);
        pending.1.retain(|u| u.id != self.0);
    }
}

/// The signal handler (on ctrlc's thread, not in signal context: it may spawn processes).
fn run_all_and_exit() {
    let undos = std::mem::take(&mut PENDING.lock().unwrap_or_else(PoisonError::into_inner).1);
    for u in undos.into_iter().rev() {
        (u.undo)();
        eprintln!("aio-bench: interrupted; {}", u.done);
    }
    std::process::exit(130);
}

/// Removes from `dir` the directories runs of earlier versions made (`aio-bench-<what>-<pid>`)
/// whose process is gone: what a `kill -9` of such a run left behind. Images are nameless now
/// ([`crate::targets::image`]), so a run of this version leaves nothing to remove. Returns how many
/// were removed.
pub fn remove_dead_runs(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("aio-bench-"))
            .and_then(|rest| rest.rsplit('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        // SAFETY: kill with signal 0 sends nothing; it only asks whether `pid` exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        let ours = pid == std::process::id() as i32;
        if is_dir && gone && !ours && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_runs_are_removed_and_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("aio-cleanup-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid that cannot be alive (above the kernel's pid_max) and ours.
        let dead = dir.join("aio-bench-matrix-2147483000");
        let live = dir.join(format!("aio-bench-matrix-{}", std::process::id()));
        let other = dir.join("not-ours-1");
        for d in [&dead, &live, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("disk-0.img"), b"x").unwrap();
        }
        assert_eq!(remove_dead_runs(&dir), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
