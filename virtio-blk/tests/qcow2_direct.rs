//! The direct path of a qcow2 image (reads and writes inside clusters the image owns go to the
//! engine without imago): every change that may free or zero a cluster the path knows makes
//! it forget that cluster before the guest hears of the change, on every engine.
//!
//! Needs `qemu-img` (Debian's `qemu-utils`; `.ci/run` installs it).

mod common;
#[path = "common/ops.rs"]
mod ops;

use std::sync::Arc;

use aio::EngineKind;
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::spec;
use ops::{new_qcow2, options, qemu, range_op, read, serve, write};

const CLUSTER: u64 = 64 << 10;
const SIZE: u64 = 16 << 20;

/// A directory with `disk.qcow2`, a new 16 MiB image made by `qemu-img`, opened for writing.
fn new_image() -> (tempfile::TempDir, Arc<BlockDevice>) {
    let (dir, path) = new_qcow2("disk.qcow2", "16M");
    let device = BlockDevice::open(&path, DiskOptions::default()).unwrap();
    (dir, Arc::new(device))
}

/// Writes `byte` over cluster `c` and reads it back twice (the second read, and any later
/// request there, take the direct path).
fn fill_and_cache(d: &mut aio_virtio_blk::driver::SplitRingDriver, c: u64, byte: u8) {
    assert_eq!(write(d, c * CLUSTER, &[byte; CLUSTER as usize]), spec::S_OK);
    for _ in 0..2 {
        let (status, data) = read(d, c * CLUSTER, CLUSTER as usize);
        assert_eq!(status, spec::S_OK);
        assert!(data.iter().all(|&b| b == byte), "cluster {c}: {byte:#x}");
    }
}

fn assert_cluster(d: &mut aio_virtio_blk::driver::SplitRingDriver, c: u64, byte: u8, why: &str) {
    let (status, data) = read(d, c * CLUSTER, CLUSTER as usize);
    assert_eq!(status, spec::S_OK, "{why}");
    assert!(data.iter().all(|&b| b == byte), "cluster {c}: {why}");
}

#[test]
fn clusters_freed_zeroed_or_cut_off_are_never_served_from_their_old_place() {
    for kind in EngineKind::available() {
        let Ok(engine) = kind.build(&options()) else {
            aio_conformance::skip(&format!("engine {kind}: refused here"));
            continue;
        };
        let (dir, device) = new_image();
        let at = dir.path();
        let resizer = device.clone();
        serve(engine, device, move |d| {
            // A write in place, then partial reads and writes inside a known cluster.
            fill_and_cache(d, 0, 0x11);
            assert_eq!(write(d, 4096, &[0x22; 4096]), spec::S_OK);
            let (_, data) = read(d, 0, 3 * 4096);
            assert!(data[..4096].iter().all(|&b| b == 0x11));
            assert!(data[4096..8192].iter().all(|&b| b == 0x22), "in place");
            assert!(data[8192..].iter().all(|&b| b == 0x11));

            // Discarded, then new clusters allocated (the freed one may be handed out again):
            // the discarded cluster reads zeros, not the new data.
            assert_eq!(range_op(d, spec::T_DISCARD, 0, CLUSTER, false), spec::S_OK);
            assert_cluster(d, 0, 0, "after the discard");
            for c in 32..40 {
                assert_eq!(write(d, c * CLUSTER, &[0x33; CLUSTER as usize]), spec::S_OK);
            }
            assert_cluster(d, 0, 0, "after the freed cluster's reuse");
            assert_cluster(d, 32, 0x33, "a new cluster");

            // Zeroed with and without unmapping.
            for (c, unmap) in [(2u64, false), (3, true)] {
                fill_and_cache(d, c, 0x44);
                let s = range_op(d, spec::T_WRITE_ZEROES, c * CLUSTER, CLUSTER, unmap);
                assert_eq!(s, spec::S_OK);
                assert_cluster(d, c, 0, &format!("write-zeroes unmap={unmap}"));
                // And written again: the new data, wherever the cluster now lives.
                fill_and_cache(d, c, 0x55);
            }

            // A run of clusters cached by one lookup (allocated in a row, then one read):
            // discarding the one in the middle leaves its neighbours served.
            for c in 10..14 {
                assert_eq!(write(d, c * CLUSTER, &[0x77; CLUSTER as usize]), spec::S_OK);
            }
            assert_cluster(d, 10, 0x77, "the run's first cluster");
            assert_eq!(
                range_op(d, spec::T_DISCARD, 12 * CLUSTER, CLUSTER, false),
                spec::S_OK
            );
            for (c, byte) in [(11, 0x77), (12, 0), (13, 0x77)] {
                assert_cluster(d, c, byte, "around a discard in a cached run");
            }

            // The last cluster cut off by a shrink and given back by a grow reads zeros.
            let last = SIZE / CLUSTER - 1;
            fill_and_cache(d, last, 0x66);
            resizer.resize(SIZE - CLUSTER).unwrap();
            resizer.resize(SIZE).unwrap();
            assert_cluster(d, last, 0, "after a shrink and a grow");
        });
        let check = qemu(at, "qemu-img", &["check", "disk.qcow2"]);
        assert!(check.contains("No errors were found"), "{kind}: {check}");
        println!("{kind}: the direct path forgot every changed cluster");
    }
}

/// Two iothreads serve one image, each writing, caching and discarding its own clusters in
/// rounds: the host clusters one frees are handed to the other's next writes, so a stale
/// entry in the shared cache would show the other thread's data where zeros must be.
#[test]
fn clusters_freed_by_one_iothread_and_reused_by_another_never_show_through() {
    const ROUNDS: u8 = 24;
    const PER_THREAD: u64 = 8;
    let (dir, device) = new_image();
    let at = dir.path();
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let device = device.clone();
            std::thread::spawn(move || {
                let engine = EngineKind::Pool.build(&options()).unwrap();
                serve(engine, device, move |d| {
                    let mine = (0..PER_THREAD).map(|i| 2 * i + t);
                    for round in 0..ROUNDS {
                        let byte = 0x10 * (t as u8 + 1) + round;
                        for c in mine.clone() {
                            fill_and_cache(d, c, byte);
                        }
                        for c in mine.clone() {
                            let s = range_op(d, spec::T_DISCARD, c * CLUSTER, CLUSTER, false);
                            assert_eq!(s, spec::S_OK);
                        }
                        for c in mine.clone() {
                            assert_cluster(d, c, 0, &format!("thread {t} round {round}"));
                        }
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    device.close().unwrap();
    drop(device);
    let check = qemu(at, "qemu-img", &["check", "disk.qcow2"]);
    assert!(check.contains("No errors were found"), "{check}");
}
