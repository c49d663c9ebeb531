//! Tools for testing and measuring a vhost-user-blk daemon from the outside (feature
//! `testing`): a libblkio client of its socket ([`Client`]), as the crate's integration tests
//! and `aio-bench vhost` use it. The daemon itself is started as a child process by
//! `aio-test-support`'s `launch::Launch` (once here; nothing in it is vhost's).
//!
//! This module owns connections only; it never reaches into a daemon's state. What a test
//! checks, and how a bench measures, stays with them.
//!
//! ```no_run
//! use aio_vhost_user_blk::testing::{Client, ClientConfig};
//!
//! let socket = std::path::PathBuf::from("/tmp/vhost.sock");
//! let client = Client::connect(&ClientConfig::new(&socket))?;
//! println!("{} bytes", client.capacity()?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client;

/// The libblkio bindings the client is built on (requests on a [`Client::queue`]).
pub use blkio;
pub use client::{Client, ClientConfig, ClientError};
