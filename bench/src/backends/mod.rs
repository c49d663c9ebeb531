//! The backends by name: the fd monitors and engines this build has, and the probe's report
//! of which ones this kernel allows.
//!
//! This module owns the names the command line and job files use (`--fdmon`, `--engine`,
//! `auto`); the backends themselves are the workspace's crates.

pub mod engines;
pub mod monitors;
pub mod probe;
