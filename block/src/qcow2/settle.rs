//! The count of a file's modifying requests in flight, which imago waits to reach zero
//! before it frees a cluster (its `settle_writes`).
//!
//! This module owns [`Settle`] and the tokens that count into it; it submits nothing.

use std::sync::{Arc, Mutex};
use std::task::Waker;

/// The modifying requests of one file still in the kernel or a worker, and who waits for none.
#[derive(Default)]
pub(crate) struct Settle {
    pub(crate) state: Mutex<(usize, Vec<Waker>)>,
}

/// One modifying request in flight: counted until the engine is done with it.
pub(crate) struct WriteInFlight(Arc<Settle>);

impl WriteInFlight {
    pub(crate) fn new(settle: &Arc<Settle>) -> Self {
        settle.state.lock().expect("settle lock").0 += 1;
        WriteInFlight(settle.clone())
    }
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().expect("settle lock");
        state.0 -= 1;
        if state.0 == 0 {
            for w in state.1.drain(..) {
                w.wake();
            }
        }
    }
}

/// Counts writes to one file made outside imago (see [`EngineStorage::write_counter`]).
#[derive(Clone)]
pub(crate) struct WriteCounter(pub(crate) Arc<Settle>);

impl WriteCounter {
    /// One write in flight, until the value is dropped (after its completion).
    pub(crate) fn begin(&self) -> WriteInFlight {
        WriteInFlight::new(&self.0)
    }
}
