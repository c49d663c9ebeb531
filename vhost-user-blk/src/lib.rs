//! # aio-vhost-user-blk (work in progress)
#![warn(missing_docs)]

pub mod chain;
pub mod daemon;
pub mod dataplane;
pub mod device;
pub mod memory;
pub mod queue;
pub mod spec;
pub mod vhost;
