//! What the block layer's integration tests share: the engines this machine builds, and
//! QEMU's tools run in a directory (both `aio-test-support`'s). Each test file uses part of it.
#![allow(dead_code, unused_imports)]

pub use aio_test_support::engines::engines;
pub use aio_test_support::tool::run_in;

pub mod bitmaps;
pub mod session;
