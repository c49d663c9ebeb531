//! Undoing what a run set up (its image directory, a loop device), also when a signal ends it.
//!
//! Guards undo their work in `Drop`; a signal ends the process without running destructors, so
//! a guard also registers with [`on_signal`] what a signal must undo. The first registration
//! installs one `ctrlc` handler (SIGINT, and with ctrlc's `termination` feature SIGTERM and
//! SIGHUP) that runs every pending undo, newest first, and exits with code 130. A guard that
//! has undone its work drops its [`OnSignal`], which unregisters the undo without running it.
//!
//! This module owns the handler and the list; what each undo does belongs to its guard
//! ([`RunDir`] here, [`crate::loopdev::LoopDevice`]).

use std::io;
use std::path::{Path, PathBuf};
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

/// A private directory for one run's files, removed with its contents on drop and on a signal.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _on_signal: OnSignal,
}

impl RunDir {
    /// Creates `path` (which must not exist yet) and registers its removal.
    pub fn create(path: PathBuf) -> io::Result<RunDir> {
        let on_signal = {
            let p = path.clone();
            on_signal(format!("{} removed", path.display()), move || {
                let _ = std::fs::remove_dir_all(p);
            })
        };
        std::fs::create_dir(&path)?;
        Ok(RunDir {
            path,
            _on_signal: on_signal,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
