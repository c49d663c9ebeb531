//! Tools for testing and measuring a vhost-user-blk daemon from the outside (feature
//! `testing`): the daemon started as a child process ([`Launch`], [`Daemon`]) and a libblkio
//! client of its socket ([`Client`]), as the crate's integration tests and `aio-bench vhost`
//! use them.
//!
//! This module owns processes and connections only; it never reaches into a daemon's state.
//! What a test checks, and how a bench measures, stays with them.
//!
//! ```no_run
//! use aio_vhost_user_blk::testing::{Client, ClientConfig, Launch};
//!
//! let socket = std::path::PathBuf::from("/tmp/vhost.sock");
//! let daemon = Launch::new("aio-vhost-user-blk")
//!     .args(["--disk", "socket=/tmp/vhost.sock,image=/var/lib/disk.img"])
//!     .socket(socket.clone())
//!     .start()?;
//! let client = Client::connect(&ClientConfig::new(&socket))?;
//! println!("{} bytes", client.capacity()?);
//! drop(client);
//! daemon.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client;
mod launch;

/// The libblkio bindings the client is built on (requests on a [`Client::queue`]).
pub use blkio;
pub use client::{Client, ClientConfig, ClientError};
pub use launch::{Daemon, Launch, LaunchError};
