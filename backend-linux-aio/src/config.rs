//! The engine's settings.
//!
//! This module owns `LinuxAioConfig` and the buffered-file policy; it never touches the kernel.

use aio_core::engine::DEFAULT_MAX_BATCH;

/// What to do with requests on files opened without `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferedPolicy {
    /// Accept them (io_submit then blocks for the I/O) and count them in
    /// [`LinuxAioStats::buffered_requests`](crate::LinuxAioStats::buffered_requests), where a caller can see and report it.
    #[default]
    Count,
    /// Refuse them with [`RequestError::Unsupported`](aio_core::engine::RequestError::Unsupported).
    Refuse,
}

/// Engine settings: [`LinuxAioConfig::default`] and the `with_*` setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinuxAioConfig {
    /// Completion ring size: the most requests the kernel holds at once (default 1024).
    pub ring_size: u32,
    /// Most iocbs per `io_submit` (default 32, QEMU's aio-max-batch).
    pub max_batch: usize,
    /// Requests on files without `O_DIRECT`.
    pub buffered: BufferedPolicy,
}

impl Default for LinuxAioConfig {
    fn default() -> Self {
        LinuxAioConfig {
            ring_size: 1024,
            max_batch: DEFAULT_MAX_BATCH,
            buffered: BufferedPolicy::Count,
        }
    }
}

aio_core::kit::with_setters!(LinuxAioConfig {
    /// With a completion ring of `ring_size` events (at least 1).
    with_ring_size => ring_size: u32,
    /// With at most `max_batch` iocbs per `io_submit` (at least 1).
    with_max_batch => max_batch: usize,
    /// With the policy `buffered` for files without `O_DIRECT`.
    with_buffered => buffered: BufferedPolicy,
});
