//! The whole aio-core event-loop conformance suite against the io_uring fd monitor. Where
//! io_uring is unusable (the `kernel.io_uring_disabled` sysctl, a seccomp filter, the memlock
//! limit) every test says why (`skipped: ...`), and fails under `AIO_REQUIRE_ALL_BACKENDS=1`.
aio_core::event_loop_conformance!(
    probe: aio_backend_uring::probe().map(drop),
    aio_backend_uring::UringLoop::new().expect("io_uring_setup")
);

/// Where io_uring is refused (a container runtime's seccomp profile), this whole suite says
/// `skipped:` with the reason and passes, without `AIO_REQUIRE_ALL_BACKENDS`: this test binary
/// again, in a child whose seccomp filter refuses `io_uring_setup`.
#[test]
fn refused_kernel_makes_every_test_skip_not_panic() {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--skip",
        "refused_kernel",
        "--test-threads=2",
        "--nocapture",
    ])
    .env_remove("AIO_REQUIRE_ALL_BACKENDS");
    aio_core::testing::seccomp::refuse_syscalls(&mut cmd, &[libc::SYS_io_uring_setup]);
    let out = cmd.output().expect("the suite in a child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let skipped = text.lines().filter(|l| l.starts_with("skipped: ")).count();
    assert!(skipped >= 20, "every test skipped, saying why: {text}");
    assert!(text.contains("EPERM") || text.contains("seccomp"), "{text}");
}
