//! The loop device: sizes parsed and split between disks, a drop that returns with the device
//! detached (while other threads fork children), and the matrix on four disks of one device
//! with `--verify`.

use super::*;

#[test]
fn parses_loop_sizes() {
    assert_eq!("loop".parse::<LoopSpec>().unwrap().size, DEFAULT_SIZE);
    assert_eq!("loop:64m".parse::<LoopSpec>().unwrap().size, 64 << 20);
    assert_eq!("loop:1G".parse::<LoopSpec>().unwrap().size, 1 << 30);
    assert_eq!("loop:2048k".parse::<LoopSpec>().unwrap().size, 2 << 20);
    for (arg, needle) in [
        ("loop:abc", "'abc'"),
        ("loop:", "''"),
        ("loop:4x", "'4x'"),
        ("loop:0", "'0'"),
        ("loop:512k", "less than"),
        ("loop:1049600", "not a multiple of 4k"),
    ] {
        let e = arg.parse::<LoopSpec>().unwrap_err();
        assert!(matches!(e, LoopError::BadSize { .. }), "{arg}: {e:?}");
        assert!(
            e.to_string().contains(needle),
            "{arg}: '{e}' lacks {needle}"
        );
    }
    for arg in ["nvme", "loopy", "loop;64m", ""] {
        let e = arg.parse::<LoopSpec>().unwrap_err();
        assert!(matches!(e, LoopError::UnknownDevice(_)), "{arg}: {e:?}");
    }
}

#[test]
fn splits_the_device_between_disks() {
    let spec = LoopSpec { size: 512 << 20 };
    assert_eq!(spec.per_disk(1, 4096).unwrap(), 512 << 20);
    assert_eq!(spec.per_disk(256, 4096).unwrap(), 2 << 20);
    // Rounded down to 4 KiB, so every region starts aligned for O_DIRECT.
    let odd = LoopSpec { size: 100 << 20 };
    assert_eq!(odd.per_disk(3, 4096).unwrap() % 4096, 0);
    let e = LoopSpec { size: 64 << 20 }.per_disk(256, 4096).unwrap_err();
    assert!(e.to_string().contains("256 disks"), "{e}");
    assert!(
        e.to_string().contains("loop:256m"),
        "the size that would do: {e}"
    );
    assert!(LoopSpec { size: 4 << 20 }.per_disk(1, 8 << 20).is_err());
}

/// A drop returns with the device detached even while another thread spawns children,
/// each of which holds a copy of the device's fds until its `exec` (a `pre_exec` step, as
/// the vhost daemons' CPU pinning has, forks, and this one waits 5 ms before the `exec`).
#[test]
fn a_drop_detaches_while_children_are_spawned() {
    use std::os::unix::process::CommandExt;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    let spec = LoopSpec { size: 4 << 20 };
    let Some(first) = aio_conformance::available(
        "the fast device (root, losetup, O_DIRECT in /dev/shm)",
        LoopDevice::attach(spec),
    ) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let spawner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut spawned = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let mut child = Command::new("true");
                // SAFETY: the closure only calls `nanosleep`, which is async-signal-safe
                // and touches no state of the parent's threads (no allocation, no lock).
                unsafe {
                    child.pre_exec(|| {
                        let pause = libc::timespec {
                            tv_sec: 0,
                            tv_nsec: 5_000_000,
                        };
                        libc::nanosleep(&pause, std::ptr::null_mut());
                        Ok(())
                    })
                };
                child.status().unwrap();
                spawned += 1;
            }
            spawned
        })
    };
    let mut dev = first;
    for round in 0..20 {
        let backing = dev.backing_file().display().to_string();
        drop(dev);
        let listed = losetup(&["-a"]).unwrap();
        assert!(!listed.contains(&backing), "round {round}: {listed}");
        dev = LoopDevice::attach(spec).unwrap();
    }
    drop(dev);
    stop.store(true, Ordering::Relaxed);
    assert!(spawner.join().unwrap() > 0);
}

/// The matrix with `--verify` on four disks of one device, all driven with writes: every
/// read holds what its own disk last wrote (the regions do not overlap), and afterwards
/// nothing is left attached or in /dev/shm.
#[test]
#[cfg(all(feature = "epoll", feature = "linux-aio"))]
fn matrix_disks_share_the_device_and_verify() {
    use std::os::unix::fs::FileExt;

    use crate::matrix::{self, MatrixSpec, Workload};
    use aio::EngineKind;
    use aio::MonitorKind;

    let loop_spec = LoopSpec { size: 16 << 20 };
    let Some(dev) = aio_conformance::available(
        "the fast device (root, losetup, O_DIRECT in /dev/shm)",
        LoopDevice::attach(loop_spec),
    ) else {
        return;
    };
    let quick = MatrixSpec::quick();
    let mut spec = MatrixSpec {
        fdmons: vec![MonitorKind::Epoll],
        engines: vec![EngineKind::LinuxAio],
        disks: vec![4],
        workloads: vec![Workload::RandRw],
        active_all: true,
        ..quick
    };
    spec.cell.iodepth = 4;
    spec.cell.runtime = Duration::from_millis(200);
    spec.cell.ramp = Duration::ZERO;
    spec.cell.verify = true;
    spec.disk_size = loop_spec.per_disk(4, 4096).unwrap();
    assert_eq!(spec.disk_size, 4 << 20);
    let images = dev
        .disks(4, spec.disk_size, 4096, |i| spec.is_stamped(i))
        .unwrap();
    let cells = matrix::run_on(&spec, &images, |_, _, _| {}).unwrap();
    let r = &cells[0].result;
    assert_eq!(r.errors, 0);
    assert!(r.verified_reads > 0, "reads were checked");
    assert_eq!(r.verify_errors, 0, "{:?}", r.verify_reports);
    // Disk 2's first blocks, read through the device: stamped for offsets in disk 2.
    let f = std::fs::File::open(dev.path()).unwrap();
    let mut block = vec![0u8; 4096];
    for offset in [0u64, 4096, spec.disk_size - 4096] {
        f.read_exact_at(&mut block, 2 * spec.disk_size + offset)
            .unwrap();
        crate::load::verify::check(&block, offset).unwrap();
    }
    drop((f, images));
    let backing = dev.backing_file().to_path_buf();
    let device = dev.path().display().to_string();
    drop(dev);
    assert!(!backing.exists(), "{} left behind", backing.display());
    let listed = losetup(&["-a"]).unwrap();
    let name = backing.display().to_string();
    assert!(!listed.contains(&name), "{device} left attached: {listed}");
}
