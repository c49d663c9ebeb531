//! The pool's limits, its errors and its numbers: [`PoolConfig`], [`PoolError`], [`PoolStats`].
//!
//! This module owns the plain data a user passes in and gets back, and the rule that says which
//! limits can hold; it never touches threads, the queue or the shared state.

use std::io;
use std::time::Duration;

/// Thread limits (QEMU's `thread-pool-min`, `thread-pool-max`, and its 10 s idle timeout):
/// [`PoolConfig::default`] and the `with_*` setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Most threads at once (QEMU: 64).
    pub max_threads: usize,
    /// Threads kept even when idle (QEMU: 0).
    pub min_threads: usize,
    /// How long a thread above the minimum waits for work before it exits (QEMU: 10 s).
    pub idle_timeout: Duration,
    /// How long a thread that finished its work busy-waits for more before it sleeps (0, the
    /// default, as QEMU). At queue depth 1 the next request usually arrives within a few µs;
    /// spinning saves the cross-thread wake-up (about 20 µs on a VM) at the cost of CPU. The
    /// wait yields the CPU on every turn (`sched_yield`), so a submitter that shares the CPU
    /// runs meanwhile: a loop pinned with its pool's threads hands work over without a
    /// wake-up either way.
    pub spin: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_threads: 64,
            min_threads: 0,
            idle_timeout: Duration::from_secs(10),
            spin: Duration::ZERO,
        }
    }
}

aio_core::kit::with_setters!(PoolConfig {
    /// With at most `max_threads` threads (at least 1, and at least `min_threads`).
    with_max_threads => max_threads: usize,
    /// With `min_threads` threads kept when idle.
    with_min_threads => min_threads: usize,
    /// With threads above the minimum exiting after `idle_timeout` without work.
    with_idle_timeout => idle_timeout: Duration,
    /// With threads busy-waiting `spin` for more work before they sleep.
    with_spin => spin: Duration,
});

/// An error creating or configuring a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Limits that cannot hold.
    #[error("invalid pool limits: max_threads {max} must be >= 1 and >= min_threads {min}")]
    InvalidLimits {
        /// max_threads given.
        max: usize,
        /// min_threads given.
        min: usize,
    },
    /// The completion notifier could not be created.
    #[error("creating the pool's completion notifier failed: {0}")]
    Notifier(#[source] io::Error),
    /// A worker thread could not be spawned.
    #[error("spawning a pool thread failed: {0}")]
    Spawn(#[source] io::Error),
}

aio_core::kit::io_error_from!(PoolError, |e| match e {
    PoolError::InvalidLimits { .. } => io::ErrorKind::InvalidInput,
    PoolError::Notifier(s) | PoolError::Spawn(s) => s.kind(),
});

/// What the pool is doing, as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Threads alive.
    pub threads: usize,
    /// Threads waiting for work right now.
    pub idle: usize,
    /// The most threads alive at once.
    pub peak_threads: usize,
    /// Threads spawned in all.
    pub spawned: u64,
    /// Work queued and not started (in the pool's queue and in an open plug batch).
    pub queued: usize,
    /// Work running in a thread right now.
    pub running: usize,
    /// Work finished (completed, failed or cancelled) in all.
    pub finished: u64,
    /// Notifier writes (at most one per batch of completions).
    pub notifier_writes: u64,
    /// Idle waits that timed out (a thread retires on one only while more than the minimum
    /// are alive).
    pub idle_timeouts: u64,
    /// Writes accepted with [`RwFlags::FUA`](aio_core::engine::RwFlags::FUA) (`pwritev2` with
    /// `RWF_DSYNC`).
    pub fua_writes: u64,
}

/// Checks that `config`'s limits can hold: at least one thread, and a minimum not above the
/// maximum.
pub(crate) fn check(config: &PoolConfig) -> Result<(), PoolError> {
    if config.max_threads == 0 || config.min_threads > config.max_threads {
        return Err(PoolError::InvalidLimits {
            max: config.max_threads,
            min: config.min_threads,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadPool;

    #[test]
    fn invalid_limits_are_typed_errors() {
        let e = ThreadPool::new(PoolConfig {
            max_threads: 0,
            ..PoolConfig::default()
        })
        .unwrap_err();
        assert!(matches!(e, PoolError::InvalidLimits { max: 0, .. }));
        let e = ThreadPool::new(PoolConfig {
            max_threads: 2,
            min_threads: 3,
            ..PoolConfig::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("min_threads 3"));
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
    }
}
