//! # aio-bench
//!
//! The project's benchmark crate. Today it holds the backend selection that every comparison
//! uses ([`monitors`], [`engines`]) and runs the conformance suite against the hybrid monitor (which needs
//! both backend-poll and backend-epoll, so it cannot live in either of them). The scsi-disk
//! scaling matrix, fio job files and the `aio-bench` binary arrive with the bench issue.

pub mod engines;
pub mod fio;
pub mod image;
pub mod job;
pub mod matrix;
pub mod monitors;
pub mod scsi;
pub mod units;
