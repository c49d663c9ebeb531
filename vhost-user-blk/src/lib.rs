//! # aio-vhost-user-blk (work in progress)
#![warn(missing_docs)]

pub mod daemon;
