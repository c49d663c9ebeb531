//! Whether Linux AIO works on this kernel.
//!
//! This module owns the probe; it builds a one-event engine and drops it, never keeping one.

use crate::{LinuxAio, LinuxAioConfig, LinuxAioError};

/// Whether Linux AIO works here: `Ok(())`, or the reason it does not.
pub fn probe() -> Result<(), LinuxAioError> {
    LinuxAio::new(LinuxAioConfig {
        ring_size: 1,
        ..LinuxAioConfig::default()
    })
    .map(drop)
}
