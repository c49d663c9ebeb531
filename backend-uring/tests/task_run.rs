//! The io_uring engine's task-work modes: which one `auto` takes, completions held as task
//! work waking the eventfd and seen by `io_poll`, and the cooperative mode told apart from the
//! signal mode by what a running thread sees.

use std::collections::VecDeque;
use std::time::Duration;

use aio_backend_uring::{TaskRun, UringConfig};
use aio_conformance::engine::wait_readable;
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request};

mod common;

#[test]
fn auto_takes_deferred_task_work_where_the_kernel_has_it() {
    if !common::available() {
        return;
    }
    aio_conformance::run_test(
        "auto_takes_deferred_task_work_where_the_kernel_has_it",
        || {
            let engine = common::engine(UringConfig::default());
            // Every kernel this project supports for io_uring tests (5.19+) has one of the flag
            // modes; 6.1 and later have deferred task work.
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            let mut parts = release.trim().split(['.', '-']);
            let major: u32 = parts.next().unwrap().parse().unwrap();
            let minor: u32 = parts.next().unwrap().parse().unwrap();
            let expected = if (major, minor) >= (6, 1) {
                TaskRun::Deferred
            } else {
                TaskRun::Cooperative
            };
            assert_eq!(engine.task_run(), expected, "kernel {}", release.trim());
        },
    );
}

#[test]
fn completions_held_as_task_work_wake_the_eventfd_and_are_seen_by_io_poll() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    if !common::available() {
        return;
    }
    for mode in [TaskRun::Deferred, TaskRun::Cooperative, TaskRun::Signal] {
        let mut engine = common::engine(UringConfig::default().with_task_run(mode));
        assert_eq!(engine.task_run(), mode);
        let (read_end, mut write_end) = common::pipe();
        let file = IoFile::from(read_end);
        // An empty pipe: the read waits in the kernel until the write below, then completes
        // as task work of this thread (not inline in a syscall of ours).
        engine
            .submit(Request::read(&file, 0, AlignedBuf::new(4096), 7))
            .unwrap();
        assert!(!engine.has_completions(), "{mode:?}: nothing written yet");
        // One atomic pipe write (PIPE_BUF) of the whole buffer: the read is not short.
        write_end.write_all(&[0x5a; 4096]).unwrap();
        // A loop asleep on the eventfd wakes (5 s is only a hang guard).
        assert!(
            wait_readable(engine.notifier().as_raw_fd(), Duration::from_secs(30)),
            "{mode:?}: the eventfd was not written"
        );
        assert!(engine.has_completions(), "{mode:?}: io_poll missed it");
        let mut done = VecDeque::new();
        assert_eq!(engine.poll_completions(&mut done), 1, "{mode:?}");
        let c = done.pop_front().unwrap();
        assert_eq!(
            (c.token, c.result.as_ref().ok()),
            (7, Some(&4096)),
            "{mode:?}"
        );
        assert!(c.buf.into_one().unwrap().iter().all(|&b| b == 0x5a));
        let enters = engine.stats().task_run_enters;
        match mode {
            // The work waited for the engine's enter: it had to make one.
            TaskRun::Deferred => assert!(enters >= 1, "{mode:?}: {enters} enters"),
            TaskRun::Signal => assert_eq!(enters, 0, "the flag is not used"),
            _ => {}
        }
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(ok, 0, "sched_setaffinity to CPU {cpu}");
}

/// One read of an empty pipe that another thread fills while this one spins in user space
/// (no syscall, so nothing of this thread's runs task work on its way back from the kernel):
/// whether the engine then had to enter the kernel to post the completion.
fn entered_for_task_work(mode: TaskRun) -> bool {
    use std::io::Write;
    use std::time::Instant;
    let mut engine = common::engine(UringConfig::default().with_task_run(mode));
    assert_eq!(engine.task_run(), mode);
    let (read_end, mut write_end) = common::pipe();
    let file = IoFile::from(read_end);
    engine
        .submit(Request::read(&file, 0, AlignedBuf::new(512), 1))
        .unwrap();
    let go = std::sync::Arc::new(std::sync::Barrier::new(2));
    let writer = {
        let go = go.clone();
        std::thread::spawn(move || {
            pin_to_cpu(1);
            go.wait();
            // Let the reader reach its spin first.
            std::thread::sleep(Duration::from_millis(2));
            write_end.write_all(&[1; 512]).unwrap();
            write_end
        })
    };
    // Reader and writer on their own CPUs: a writer that preempted the reader would hand
    // the work back to it on its way to user space, which is not what is tested.
    pin_to_cpu(0);
    go.wait();
    let before = engine.stats().task_run_enters;
    let deadline = Instant::now() + Duration::from_secs(30);
    // `has_completions` reads the rings' shared memory only; `Instant::now` is the vDSO.
    while !engine.has_completions() {
        assert!(
            Instant::now() < deadline,
            "{mode:?}: the read never completed"
        );
        std::hint::spin_loop();
    }
    let mut done = VecDeque::new();
    assert_eq!(engine.poll_completions(&mut done), 1, "{mode:?}");
    assert_eq!(done[0].result.as_ref().ok(), Some(&512), "{mode:?}");
    drop(writer.join().unwrap());
    engine.stats().task_run_enters > before
}

#[test]
fn the_cooperative_mode_leaves_task_work_to_a_running_thread_and_the_signal_mode_does_not() {
    if !common::available() {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("skipped: the task-run modes are told apart with two CPUs");
        return;
    }
    // Cooperative (COOP_TASKRUN with TASKRUN_FLAG): the writer's wake-up does not interrupt
    // this thread; the kernel raises IORING_SQ_TASKRUN and the engine enters to run the work.
    // A timer tick that preempts the spinner can run the work first, so one attempt of 20
    // must show it: attempts go on until one does, for up to a minute (another process on
    // the CPUs preempts the spinner more often, so a count of attempts would depend on the
    // load). Signal mode: the wake-up interrupts the spinner, which runs the work on its way
    // back to user space; the engine never enters for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut attempts = 0;
    while !entered_for_task_work(TaskRun::Cooperative) {
        attempts += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "cooperative: no attempt of {attempts} in a minute saw the task-run flag"
        );
    }
    let signal = (0..20)
        .filter(|_| entered_for_task_work(TaskRun::Signal))
        .count();
    assert_eq!(signal, 0, "signal mode entered for task work");
}
