//! A guest's single requests on the in-process driver, and QEMU's image tools (shared by the
//! image and resize tests; each uses some of them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aio::{EngineOptions, IoEngine};
use aio_virtio_blk::device::BlockDevice;
use aio_virtio_blk::driver::{DriverRequest, Finished, SplitRingDriver};
use aio_virtio_blk::spec;

use crate::common::{self, Ring};

/// Each slot's data buffer: the largest request the tests post.
pub const SLOT_BYTES: u32 = 64 << 10;

/// Runs a QEMU tool in `dir`; its standard output (a failure fails the test with its words).
pub fn qemu(dir: &Path, tool: &str, args: &[&str]) -> String {
    aio_test_support::tool::run_in(dir, tool, args)
}

/// A new directory in `/var/tmp` (O_DIRECT works there, not on tmpfs) holding `name`, a new
/// qcow2 image of `size` (`16M`, `64M`) made by `qemu-img`; the image's path.
pub fn new_qcow2(name: &str, size: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let path = aio_test_support::images::qcow2_image(dir.path(), name, size);
    (dir, path)
}

/// What the engines are built with: discard and write-zeroes on a thread pool behind Linux
/// AIO, as the daemon builds them.
pub fn options() -> EngineOptions {
    aio_test_support::engines::options()
}

/// Posts one request in slot 0 and waits for its status.
pub fn one(d: &mut SplitRingDriver, kind: u32, sector: u64, len: u32) -> u8 {
    d.post(0, DriverRequest { kind, sector, len }).unwrap();
    d.notify().unwrap();
    let mut out: Vec<Finished> = Vec::new();
    while out.is_empty() {
        let raised = d.wait_interrupt(Some(Duration::from_secs(30))).unwrap();
        d.take_used(&mut out).unwrap();
        assert!(raised || !out.is_empty(), "no interrupt for 30 s");
    }
    out[0].status
}

pub fn write(d: &mut SplitRingDriver, offset: u64, data: &[u8]) -> u8 {
    d.write_data(0, data).unwrap();
    one(d, spec::T_OUT, offset / 512, data.len() as u32)
}

pub fn read(d: &mut SplitRingDriver, offset: u64, len: usize) -> (u8, Vec<u8>) {
    let status = one(d, spec::T_IN, offset / 512, len as u32);
    let mut data = vec![0u8; len];
    d.read_data(0, &mut data).unwrap();
    (status, data)
}

/// A discard or write-zeroes of `len` bytes at `offset`.
pub fn range_op(d: &mut SplitRingDriver, kind: u32, offset: u64, len: u64, unmap: bool) -> u8 {
    let mut seg = [0u8; 16];
    seg[..8].copy_from_slice(&(offset / 512).to_le_bytes());
    seg[8..12].copy_from_slice(&((len / 512) as u32).to_le_bytes());
    seg[12..16].copy_from_slice(&u32::from(unmap).to_le_bytes());
    d.write_data(0, &seg).unwrap();
    one(d, kind, 0, 16)
}

/// Serves one queue of `device` with `engine` on this thread while `guest` drives it from
/// another; returns the guest's result. The last handle of the device closes its image.
pub fn serve<T: Send + 'static>(
    engine: Box<dyn IoEngine>,
    device: Arc<BlockDevice>,
    guest: impl FnOnce(&mut SplitRingDriver) -> T + Send + 'static,
) -> T {
    let ring = Ring {
        size: 64,
        slots: 8,
        data_bytes: SLOT_BYTES,
    };
    common::serve(engine, device, ring, guest).0
}
