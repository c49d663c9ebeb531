//! `aio-bench` on the fast device as a user runs it: bad `--device` input, a run that
//! detaches its loop device afterwards, and the device detached after SIGTERM and after
//! SIGKILL.

use std::path::PathBuf;

mod common;

use common::{
    assert_cleaned_up, attached_to, bench, expect_bad_input, loop_device_unusable, text, TempDir,
};

#[test]
fn device_bad_input_exits_2_and_says_what() {
    let dir = TempDir::new("device-bad");
    let job = dir.0.join("j.fio");
    std::fs::write(&job, "[j]\nrw=randread\n").unwrap();
    let job = job.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", job, "--device", "loop:12q"], "'12q'"),
        (vec!["latency", "--device", "loop:1000"], "'1000'"),
        (vec!["vs-fio", "--device", "loop:"], "'' is not a size"),
        (vec!["matrix", "--device", "nvme"], "unknown device"),
        // Checked before anything is set up: no root needed to be told.
        (
            vec!["matrix", "--device", "loop:64m", "--disks", "256"],
            "256 disks",
        ),
        (vec!["matrix", "--device", "loop", "--dir", "/tmp"], "--dir"),
    ];
    expect_bad_input(&cases);
}

#[test]
#[cfg(all(feature = "linux-aio", feature = "pool"))]
fn run_on_the_loop_device_detaches_it_afterwards() {
    if let Some(reason) = loop_device_unusable() {
        aio_conformance::skip(&reason);
        return;
    }
    let dir = TempDir::new("device-run");
    let job = dir.0.join("j.fio");
    // io_uring where the kernel runs it (its discards then go to the pool beside it), else the
    // same route from Linux AIO.
    let trims = common::usable(&["io_uring"])
        .first()
        .copied()
        .unwrap_or("libaio");
    std::fs::write(
        &job,
        format!(
            "[global]\nrw=randread\niodepth=1\ndirect=1\ntime_based\nruntime=200ms\nfdmon=poll\n\
             [aio]\nioengine=libaio\n[threads]\nioengine=psync\nfilename=ignored.img\n\
             [trims]\nioengine={trims}\nrw=randtrim\nbs=64k\n"
        ),
    )
    .unwrap();
    let child = bench()
        .args(["run", job.to_str().unwrap(), "--device", "loop:64m"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let backing = PathBuf::from(format!("/dev/shm/aio-bench-loop-{}.img", child.id()));
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("aio: (groupid=0"), "{t}");
    assert!(
        t.contains("file=/dev/loop"),
        "the jobs ran on the device: {t}"
    );
    assert!(!t.contains("ignored.img"), "filename= is replaced: {t}");
    assert!(t.contains("read: IOPS="), "{t}");
    // Neither io_uring nor Linux AIO sends a block device's discard: the pool beside them
    // does (BLKDISCARD).
    assert!(t.contains("trims: (groupid=0, jobs=1): err= 0"), "{t}");
    assert!(t.contains("trim: IOPS="), "{t}");
    assert_cleaned_up(&backing);
    assert_eq!(dir.entries(), 1, "only the job file");
}

/// `aio-bench latency --device loop:64m` in a child, once its device is attached and the run
/// has started (the device has served reads); with the backing file's path.
/// Whether this process may set autoclear on a loop device: `LOOP_SET_STATUS64` needs
/// `CAP_SYS_ADMIN` (bit 21 of the effective set), which attaching one does not.
fn may_set_autoclear() -> bool {
    let cap_eff = aio_test_support::procfs::Proc::current()
        .status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0);
    cap_eff & (1 << 21) != 0
}

fn latency_run_on_the_loop_device() -> (std::process::Child, PathBuf) {
    let mut child = bench()
        .args(["latency", "--device", "loop:64m", "--runtime", "60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let backing = PathBuf::from(format!("/dev/shm/aio-bench-loop-{}.img", child.id()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while attached_to(&backing).is_empty() {
        assert!(
            std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the device never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The run has started once the device has served reads (its own count in sysfs) and the
    // setup is over.
    let device = attached_to(&backing)[0]
        .split(':')
        .next()
        .unwrap()
        .trim_start_matches("/dev/")
        .to_string();
    let reads = || {
        std::fs::read_to_string(format!("/sys/block/{device}/stat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Reads alone do not say the setup is over (udev probes a new device as soon as it is
    // attached); the backing file losing its name does: it is the setup's last step, after
    // autoclear is set (where the kernel lets this process set it; elsewhere the file keeps
    // its name until the run ends).
    let autoclear = may_set_autoclear();
    while reads() == 0 || (autoclear && backing.exists()) {
        assert!(
            std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the run never read from {device}, or its backing file kept its name"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (child, backing)
}

#[test]
fn a_signal_detaches_the_loop_device() {
    if let Some(reason) = loop_device_unusable() {
        aio_conformance::skip(&reason);
        return;
    }
    let (child, backing) = latency_run_on_the_loop_device();
    // SIGTERM (ctrlc's `termination` feature): the handler detaches the busy device and
    // removes its file.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(130), "{t}");
    assert!(t.contains("interrupted; loop device"), "{t}");
    assert_cleaned_up(&backing);
}

/// SIGKILL (no handler, no destructor runs) in the middle of a run on the loop device: the
/// kernel detaches the device (autoclear) and frees its nameless backing file.
#[test]
fn kill_9_detaches_the_loop_device() {
    if let Some(reason) = loop_device_unusable() {
        aio_conformance::skip(&reason);
        return;
    }
    if !may_set_autoclear() {
        aio_conformance::skip("autoclear on a loop device needs CAP_SYS_ADMIN");
        return;
    }
    let (mut child, backing) = latency_run_on_the_loop_device();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_cleaned_up(&backing);
}
