//! The device driven through the in-process split-ring driver, as a guest would: a queue
//! over a real image and engine, requests from another thread, the ring wrapped many times.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aio::pool::{PoolConfig, ThreadPool};
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::driver::{DriverError, DriverRequest, Finished, SplitRingDriver};
use aio_virtio_blk::spec;
use common::Ring;

const SECTORS_PER_BLOCK: u64 = 8;

/// Serves a queue over a fresh 4 MiB image on this thread while `guest` drives it from
/// another; returns the guest's result and the queue's next avail index at stop.
fn serve<T: Send + 'static>(
    size: u16,
    slots: u16,
    guest: impl FnOnce(&mut SplitRingDriver) -> T + Send + 'static,
) -> (T, u16) {
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let path = dir.path().join("disk.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let device = BlockDevice::open(&path, DiskOptions::default()).unwrap();
    serve_device(device, size, slots, guest)
}

/// As [`serve`], on `device`.
fn serve_device<T: Send + 'static>(
    device: BlockDevice,
    size: u16,
    slots: u16,
    guest: impl FnOnce(&mut SplitRingDriver) -> T + Send + 'static,
) -> (T, u16) {
    let engine = ThreadPool::new(PoolConfig::default()).unwrap();
    let ring = Ring {
        size,
        slots,
        data_bytes: 4096,
    };
    common::serve(engine, Arc::new(device), ring, guest)
}

/// Waits for at least one finished request (a lost interrupt is a failure after 30 s).
fn reap(driver: &mut SplitRingDriver, out: &mut Vec<Finished>) {
    let before = out.len();
    while out.len() == before {
        let raised = driver
            .wait_interrupt(Some(Duration::from_secs(30)))
            .unwrap();
        driver.take_used(out).unwrap();
        assert!(raised || out.len() > before, "no interrupt for 30 s");
    }
}

#[test]
fn every_block_written_reads_back_through_a_ring_wrapped_many_times() {
    const BLOCKS: u16 = 96;
    let ((), next) = serve(16, 5, |d| {
        // Writes of every block in rounds of five in flight: 96 requests on a 16-entry ring.
        for round in (0..BLOCKS)
            .collect::<Vec<_>>()
            .chunks(usize::from(d.slots()))
        {
            for (slot, &block) in (0..).zip(round) {
                d.write_data(slot, &[block as u8; 4096]).unwrap();
                let sector = u64::from(block) * SECTORS_PER_BLOCK;
                let write = DriverRequest {
                    kind: spec::T_OUT,
                    sector,
                    len: 4096,
                };
                d.post(slot, write).unwrap();
            }
            d.notify().unwrap();
            let mut done = Vec::new();
            while done.len() < round.len() {
                reap(d, &mut done);
            }
            assert!(done.iter().all(|f| f.status == spec::S_OK), "{done:?}");
        }
        // Read every block back, one at a time, and compare.
        for block in 0..BLOCKS {
            let sector = u64::from(block) * SECTORS_PER_BLOCK;
            d.post(
                0,
                DriverRequest {
                    kind: spec::T_IN,
                    sector,
                    len: 4096,
                },
            )
            .unwrap();
            d.notify().unwrap();
            let mut done = Vec::new();
            reap(d, &mut done);
            assert_eq!(
                done,
                [Finished {
                    slot: 0,
                    status: spec::S_OK,
                    written: 4097
                }]
            );
            let mut back = [0u8; 4096];
            d.read_data(0, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == block as u8), "block {block}");
        }
    });
    assert_eq!(next, 2 * BLOCKS);
}

#[test]
fn flush_and_get_id_answer_and_a_read_past_the_end_is_an_ioerr() {
    let (statuses, next) = serve(8, 2, |d| {
        let mut statuses = Vec::new();
        for request in [
            DriverRequest {
                kind: spec::T_FLUSH,
                sector: 0,
                len: 0,
            },
            DriverRequest {
                kind: spec::T_GET_ID,
                sector: 0,
                len: 20,
            },
            DriverRequest {
                kind: spec::T_IN,
                sector: 8192,
                len: 4096,
            },
        ] {
            d.post(1, request).unwrap();
            d.notify().unwrap();
            let mut done = Vec::new();
            reap(d, &mut done);
            statuses.push(done[0].status);
        }
        statuses
    });
    assert_eq!(statuses, [spec::S_OK, spec::S_OK, spec::S_IOERR]);
    assert_eq!(next, 3);
}

#[test]
fn bad_sizes_and_slots_are_refused() {
    for (size, slots) in [(6, 2), (8, 3), (8, 0), (2, 1)] {
        let e = SplitRingDriver::new(size, slots, 4096).unwrap_err();
        assert!(
            matches!(e, DriverError::BadSize { .. }),
            "{size} {slots}: {e}"
        );
    }
    let (mut d, _side) = SplitRingDriver::new(8, 2, 4096).unwrap();
    let big = DriverRequest {
        kind: spec::T_IN,
        sector: 0,
        len: 8192,
    };
    assert!(matches!(
        d.post(0, big),
        Err(DriverError::BadRequest { .. })
    ));
    let far = DriverRequest {
        kind: spec::T_IN,
        sector: 0,
        len: 512,
    };
    assert!(matches!(
        d.post(2, far),
        Err(DriverError::BadRequest { .. })
    ));
}

#[test]
fn a_window_of_an_image_is_a_disk_of_its_own() {
    use std::os::unix::fs::FileExt;
    let dir = aio_test_support::images::image_dir("virtio-blk-test");
    let path = dir.path().join("shared.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let whole = BlockDevice::open(&path, DiskOptions::default()).unwrap();
    // Bad windows: not whole sectors, or empty.
    for (offset, size) in [(100, 4096), (0, 1000), (4096, 0)] {
        let e = BlockDevice::window(
            whole.file().unwrap().clone(),
            offset,
            size,
            DiskOptions::default(),
        );
        assert!(e.is_err(), "{offset} {size}");
    }
    // The second MiB as a disk: its sector 8 is the image's byte 1 MiB + 4 KiB, and a read
    // past its 1 MiB is refused although the image goes on.
    let window = BlockDevice::window(
        whole.file().unwrap().clone(),
        1 << 20,
        1 << 20,
        DiskOptions::default(),
    )
    .unwrap();
    assert_eq!(window.capacity_sectors(), 2048);
    let (statuses, _) = serve_device(window, 8, 2, |d| {
        let mut statuses = Vec::new();
        d.write_data(0, &[0xc3; 4096]).unwrap();
        for request in [
            DriverRequest {
                kind: spec::T_OUT,
                sector: 8,
                len: 4096,
            },
            DriverRequest {
                kind: spec::T_IN,
                sector: 2048,
                len: 4096,
            },
        ] {
            d.post(0, request).unwrap();
            d.notify().unwrap();
            let mut done = Vec::new();
            reap(d, &mut done);
            statuses.push(done[0].status);
        }
        statuses
    });
    assert_eq!(statuses, [spec::S_OK, spec::S_IOERR]);
    let image = std::fs::File::open(&path).unwrap();
    let mut at = [0u8; 4096];
    image.read_exact_at(&mut at, (1 << 20) + 4096).unwrap();
    assert!(at.iter().all(|&b| b == 0xc3));
    image.read_exact_at(&mut at, 4096).unwrap();
    assert!(
        at.iter().all(|&b| b == 0),
        "the image's own sector 8 is untouched"
    );
}
