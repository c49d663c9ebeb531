//! Why a disk cannot be served: [`DeviceError`], the device's own refusals (its serial, its
//! queues) and its image's ([`OpenError`]).
//!
//! This module owns the error type and its conversion to `io::Error`; it opens nothing.

use std::io;

use aio_block::image::OpenError;

/// Why a disk cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The serial is longer than the 20 bytes `GET_ID` answers.
    #[error("serial '{0}' is longer than 20 bytes")]
    SerialTooLong(String),
    /// Zero queues, or more than 256.
    #[error("{0} queues (1 to 256)")]
    BadQueueCount(u16),
    /// The image could not be opened (each variant names it).
    #[error(transparent)]
    Image(#[from] OpenError),
}

impl From<DeviceError> for io::Error {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::Image(e) => e.into(),
            other => io::Error::new(io::ErrorKind::InvalidInput, other),
        }
    }
}
