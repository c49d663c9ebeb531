//! What the vhost-user-blk client runs against one socket: the [`ClientSpec`] (pattern, block
//! size, depth, queues, window, verify, CPU) and its bounds.
//!
//! This module owns the client's job description only; never its run ([`super::client`],
//! [`super::queue`]) or the command line that fills it in (`cmd::vhost` in the binary).

use std::time::Duration;

use crate::load::Pattern;

/// The largest `--iodepth` per queue: libblkio's default virtqueue size (256 descriptors, one
/// per request of one buffer).
pub const MAX_IODEPTH: usize = 256;

/// What the client runs against one socket.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// The pattern: randread, randwrite, randrw (or the sequential read, write, rw).
    pub rw: Pattern,
    /// The percentage of reads with randrw and rw (fio's `rwmixread`).
    pub rwmixread: u8,
    /// Bytes per request.
    pub bs: usize,
    /// Requests in flight per queue (1..=[`MAX_IODEPTH`]).
    pub iodepth: usize,
    /// Virtqueues used (libblkio's `num-queues`), one client thread each.
    pub queues: usize,
    /// The measured window.
    pub runtime: Duration,
    /// The warm-up before it.
    pub ramp: Duration,
    /// Stamp writes and check reads; a mismatch fails the run.
    pub verify: bool,
    /// Pin the client threads to this CPU.
    pub cpu: Option<usize>,
}
